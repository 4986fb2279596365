-- wrk script: POST the body in $WRK_BODY_FILE and print one JSON line of results at the end.
local f = assert(io.open(os.getenv("WRK_BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\nWRK_JSON {"requests": %d, "duration_us": %d, "bytes": %d, "p50_us": %d, "p90_us": %d, '
    .. '"p99_us": %d, "max_us": %d, "mean_us": %.1f, "connect_errors": %d, "read_errors": %d, '
    .. '"write_errors": %d, "status_errors": %d, "timeouts": %d}\n',
    summary.requests, summary.duration, summary.bytes, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, latency.mean, e.connect, e.read, e.write, e.status, e.timeout))
end
