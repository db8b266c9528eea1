-- wrk script used by bench/run: no per-request Lua (it would cost wrk CPU),
-- only a done() hook that prints one machine-readable line:
--   WRKJSON {"requests":..,"p50_us":..,"p99_us":..,"connect":..,...}
-- Latencies are in microseconds, as wrk records them.  "status" is wrk's
-- "Non-2xx or 3xx responses" counter (status > 399).

done = function(summary, latency, requests)
  local e = summary.errors
  local function p(q)
    if summary.requests == 0 then return 0 end
    return latency:percentile(q)
  end
  io.write(string.format(
    'WRKJSON {"duration_us":%d,"requests":%d,"bytes":%d,' ..
    '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"p999_us":%d,' ..
    '"max_us":%d,"mean_us":%.1f,"stdev_us":%.1f}\n',
    summary.duration, summary.requests, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    p(50), p(90), p(99), p(99.9),
    latency.max, latency.mean, latency.stdev))
end
