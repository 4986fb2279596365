-- wrk script: POST the AdmissionReview in $WRK_BODY_FILE, each request with its own request.uid (as
-- kube-apiserver sends them: same length, unique), and print one JSON line of results at the end.
local f = assert(io.open(os.getenv("WRK_BODY_FILE"), "rb"))
local template = f:read("*a")
f:close()
-- the first "uid" of the body is request.uid (the bench's pod has none)
local head, uid, tail = template:match('^(.-"uid": ?")([^"]*)(".*)$')
assert(head, "no uid in " .. os.getenv("WRK_BODY_FILE"))
wrk.method = "POST"
wrk.body = template
wrk.headers["Content-Type"] = "application/json"

local threads = 0
function setup(thread)
  thread:set("thread_id", threads)
  threads = threads + 1
end

local sent = 0
local prefix
function init(args)
  prefix = string.format("%s%02d-", uid:sub(1, #uid - 15), thread_id % 100)  -- keeps the uid's length
end

function request()
  sent = sent + 1
  return wrk.format(nil, nil, nil, head .. prefix .. string.format("%012d", sent % 1000000000000) .. tail)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\nWRK_JSON {"requests": %d, "duration_us": %d, "bytes": %d, "p50_us": %d, "p90_us": %d, '
    .. '"p99_us": %d, "max_us": %d, "mean_us": %.1f, "connect_errors": %d, "read_errors": %d, '
    .. '"write_errors": %d, "status_errors": %d, "timeouts": %d}\n',
    summary.requests, summary.duration, summary.bytes, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, latency.mean, e.connect, e.read, e.write, e.status, e.timeout))
end
