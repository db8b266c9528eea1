-- zimg (github.com/buaazp/zimg, its conf/zimg.lua) for bench/run's zimg cells: the seed
-- system itself beside larder-img. Filled by bench/lib/environment.py (@@...@@).
-- Its own defaults except: foreground, 127.0.0.1 only, one worker thread (the server's one
-- core), keep-alive unlimited (its sample's max_keepalives = 1 closes every connection after
-- one answer, which neither wrk's other systems nor larder do), no memcached (cache = 0), and
-- save_new = 0: a transformed image is made per request, never stored (the cells measure the
-- transform, as larder-img's uncached route does). No Lua script (type processing off).
is_daemon       = 0
ip              = '127.0.0.1'
port            = @@PORT@@
thread_num      = 1
backlog_num     = 1024
max_keepalives  = 0
retry           = 3
system          = 'larder-bench'
headers         = 'Cache-Control:max-age=7776000'
etag            = 1
admin_rule      = 'allow 127.0.0.1'
cache           = 0
log_level       = 3
log_name        = '@@RUN@@/zimg/log/zimg.log'
root_path       = '@@RUN@@/zimg/index.html'
admin_path      = '@@RUN@@/zimg/admin.html'
disable_args    = 0
disable_type    = 1
format          = 'jpeg'
quality         = 75
mode            = 1
save_new        = 0
max_size        = 100*1024*1024
allowed_type    = {'jpeg', 'jpg', 'png', 'gif', 'webp'}
img_path        = '@@RUN@@/zimg/img'

function is_img(type_name)
    local found = -1
    for _, allowed in pairs(allowed_type) do
        if string.lower(type_name) == allowed then
            found = 1
            break
        end
    end
    return found
end
