"""What the harness asks of a running server: one HTTP request (HTTP or HTTPS), a raw
response, waiting until a port answers, a JPEG's size, an image's format, the origin's request
count.
"""

import http.client
import socket
import time

from .common import HOST, PORTS, TLS_PORTS


# Exact headers: http.client would otherwise add "Accept-Encoding: identity", which wrk does
# not send.
def http_req(port, path, headers=None, method="GET", body=None, timeout=10):
    if port in TLS_PORTS:
        import ssl
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        c = http.client.HTTPSConnection(HOST, port, timeout=timeout, context=ctx)
    else:
        c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        c.putrequest(method, path, skip_accept_encoding=True,
                     skip_host=any(k.lower() == "host" for k in (headers or {})))
        for k, v in (headers or {}).items():
            c.putheader(k, v)
        if body is not None:
            c.putheader("Content-Length", str(len(body)))
        c.endheaders(body)
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        c.close()


def raw_response(port, path, headers, timeout=10):
    """The exact bytes, head and body, a server sends for the request wrk sends
    (GET, HTTP/1.1, Host with the port, the cell's headers, keep-alive)."""
    req = (f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
           + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n")
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(req.encode("latin-1"))
        buf = b""

        def more():
            nonlocal buf
            d = s.recv(1 << 20)
            if not d:
                raise OSError("connection closed before the response was complete")
            buf += d

        while b"\r\n\r\n" not in buf:
            more()
        head_len = buf.index(b"\r\n\r\n") + 4
        length, chunked = None, False
        for line in buf[:head_len].decode("latin-1").split("\r\n")[1:]:
            k, _, v = line.partition(":")
            k = k.strip().lower()
            if k == "content-length":
                length = int(v.strip())
            elif k == "transfer-encoding" and "chunked" in v.lower():
                chunked = True
        if chunked:  # up to the last chunk (no trailers expected)
            while not (buf.endswith(b"\r\n0\r\n\r\n") or buf[head_len:] == b"0\r\n\r\n"):
                more()
        elif length is None:
            raise ValueError("response has neither Content-Length nor chunked encoding")
        else:
            while len(buf) < head_len + length:
                more()
            if len(buf) != head_len + length:
                raise ValueError(f"{len(buf) - head_len - length} bytes after the response")
        return buf


def wait_http(port, path, timeout=15.0, proc=None):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            return False, f"exited with status {proc.returncode}"
        try:
            st, _, _ = http_req(port, path, timeout=2)
            return True, st
        except OSError as e:
            last = e
        time.sleep(0.1)
    return False, f"no answer on 127.0.0.1:{port}{path} within {timeout:.0f}s ({last})"


def jpeg_info(data):
    """(width, height, components) from a JPEG's SOF marker, or None."""
    i = 2
    if data[:2] != b"\xff\xd8":
        return None
    while i + 9 < len(data):
        if data[i] != 0xFF:
            i += 1
            continue
        m = data[i + 1]
        if m in (0xD8, 0x01) or 0xD0 <= m <= 0xD7 or m == 0xFF:
            i += 1 if m == 0xFF else 2
            continue
        seglen = int.from_bytes(data[i + 2:i + 4], "big")
        if m in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
            h = int.from_bytes(data[i + 5:i + 7], "big")
            w = int.from_bytes(data[i + 7:i + 9], "big")
            return w, h, data[i + 9]
        i += 2 + seglen
    return None


def image_format(data):
    """jpeg, png, webp, avif (or another ISO-BMFF image brand, as named), gif, or None, from the
    first bytes."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[4:8] == b"ftyp":
        return data[8:12].decode("latin-1").strip()
    if data[:4] == b"GIF8":
        return "gif"
    return None


def origin_requests():
    """Total requests the origin has served (nginx stub_status)."""
    try:
        _, _, body = http_req(PORTS["origin"], "/__origin_status", timeout=3)
        nums = body.decode().splitlines()[2].split()
        return int(nums[2])
    except Exception:
        return None
