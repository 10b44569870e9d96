-- SPDX-License-Identifier: MIT
-- wrk script for scripts/bench-http: prints one machine-readable line at the
-- end of a run (latencies in microseconds). Defines only done(), so wrk keeps
-- its fast path (the same pre-built request on every connection).
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "wrk_result requests=%d duration_us=%d bytes=%d status_errors=%d connect_errors=%d read_errors=%d write_errors=%d timeouts=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d mean_us=%.1f\n",
    summary.requests, summary.duration, summary.bytes, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
