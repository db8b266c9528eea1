vcl 4.1;
# Varnish under test: malloc storage and http_gzip_support (set on the
# varnishd command line by bench/run). Text bodies are stored gzipped
# (beresp.do_gzip) and gunzipped per request for clients without gzip.

backend origin {
    .host = "127.0.0.1";
    .port = "@@ORIGIN_PORT@@";
}

sub vcl_backend_response {
    if (beresp.http.Content-Type ~ "^(text/|application/(json|javascript|xml))") {
        set beresp.do_gzip = true;
    }
}

sub vcl_deliver {
    if (obj.hits > 0) {
        set resp.http.X-Cache = "HIT";
    } else {
        set resp.http.X-Cache = "MISS";
    }
}
