-- Replays pre-signed Standard Webhooks deliveries from BENCH_REQUESTS (one per line:
-- id TAB timestamp TAB signature TAB body). Thread n sends lines n, n+T, n+2T, ...
-- so ids are unique across threads except the planned duplicates. Counts 2xx.
local threads = {}
local counter = 0

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  tid = tonumber(wrk.thread:get("tid"))
  nthreads = tonumber(os.getenv("BENCH_THREADS") or "1")
  reqs = {}
  local i = 0
  for line in io.lines(os.getenv("BENCH_REQUESTS")) do
    if i % nthreads == tid then
      local id, ts, sig, body = line:match("^([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)$")
      reqs[#reqs + 1] = wrk.format("POST", "/webhooks/bench", {
        ["webhook-id"] = id, ["webhook-timestamp"] = ts, ["webhook-signature"] = sig,
        ["content-type"] = "application/json"}, body)
    end
    i = i + 1
  end
  -- BENCH_SKIP: lines of this thread's share already sent by an earlier run against
  -- the same server (the paced run's calibration probes): fresh ids, not duplicates.
  skip = tonumber(os.getenv("BENCH_SKIP") or "0")
  idx = skip
  math.randomseed(os.time() * 100 + tid)
  ok = 0
  bad = 0
end

-- BENCH_DELAY_MS > 0 paces each connection: a pause before each request, drawn from
-- an exponential distribution with that mean (wrk takes whole milliseconds: rounded
-- up or down at random, which keeps the mean). A fixed pause kept the 64 connections
-- in step, arriving in bursts of 64; random pauses give arrivals close to a Poisson
-- stream at the paced rate (the run at about 80 % of the peak, for the latency target).
local pause = tonumber(os.getenv("BENCH_DELAY_MS") or "0")
if pause > 0 then
  function delay()
    local d = -math.log(1 - math.random()) * pause
    local whole = math.floor(d)
    if math.random() < d - whole then whole = whole + 1 end
    return whole
  end
end

function request()
  idx = idx + 1
  return reqs[((idx - 1) % #reqs) + 1]
end

function response(status, headers, body)
  if status >= 200 and status < 300 then ok = ok + 1 else bad = bad + 1 end
end

function done(summary, latency, requests)
  local sent, good, failed = 0, 0, 0
  local per = {}
  for _, t in ipairs(threads) do
    sent = sent + t:get("idx") - t:get("skip")
    good = good + t:get("ok")
    failed = failed + t:get("bad")
    per[#per + 1] = tostring(t:get("idx"))  -- where it stopped, from the file's start
  end
  -- wrk's socket errors: requests that got no answer at all (refused connections,
  -- broken reads and writes, and timeouts: no answer within wrk's 2 s), which the
  -- 2xx and non-2xx counts above never see.
  local e = summary.errors
  io.write(string.format(
    "BENCH_RESULT sent=%d ok=%d bad=%d p50_us=%d p99_us=%d per_thread=%s mean_us=%d"
    .. " connect=%d read=%d write=%d timeout=%d\n",
    sent, good, failed, latency:percentile(50), latency:percentile(99), table.concat(per, ","),
    latency.mean, e.connect, e.read, e.write, e.timeout))
end
