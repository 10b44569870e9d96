-- Spec 9: back pressure. A client floods the echo server and never reads:
-- the server must stop reading from it (write_limit) instead of buffering,
-- so its RSS stays bounded, while another client is still served promptly.
-- Everything sent is echoed back intact once the flooder reads.
local H = require "spec.helper"

describe("back pressure", function()
  after_each(H.cleanup)

  it("keeps memory bounded against a client that sends and never reads", function()
    local port = H.free_port()
    local srv = H.start("echo.lua", { args = { port }, wait_port = port })
    local other = H.connect(port)
    assert.equal("warm", H.roundtrip(other, "warm"))
    local rss0 = assert(srv:rss_kb())
    local limit_kb = rss0 + 32 * 1024 * (H.scale > 1 and 2 or 1)

    -- small receive buffer: the echo backs up in the server quickly
    local flood = H.connect(port, { rcvbuf = 65536 })
    flood:settimeout(0)
    local chunk = {}
    for i = 0, 1023 do chunk[#chunk + 1] = ("%07d\n"):format(i):rep(128) end
    chunk = table.concat(chunk)                   -- 1 MiB, period 1 MiB
    local total, sent, pos = 200 * 1024 * 1024, 0, 1
    local max_rss, worst_rtt, checks = rss0, 0, 0
    local stalled_since
    local t0 = H.now()
    local next_check = t0 + 0.25
    while H.now() - t0 < 5 and sent < total do
      local last, err, partial = flood:send(chunk, pos)
      local upto = last or partial or pos - 1
      sent = sent + (upto - pos + 1)
      pos = upto + 1
      if pos > #chunk then pos = 1 end
      if err and err ~= "timeout" then error("flood send: " .. err) end
      if err == "timeout" then
        stalled_since = stalled_since or H.now()
        H.wait_fd(flood:getfd(), H.POLLOUT, 0.05)
      else
        stalled_since = nil
      end
      if H.now() >= next_check then
        next_check = H.now() + 0.25
        local rss = srv:rss_kb() or 0
        if rss > max_rss then max_rss = rss end
        local t = H.now()
        local msg = "probe" .. checks
        assert.equal(msg, H.roundtrip(other, msg, msg, H.T(2)), "other client not served")
        worst_rtt = math.max(worst_rtt, H.now() - t)
        checks = checks + 1
      end
    end
    local rss = srv:rss_kb() or 0
    if rss > max_rss then max_rss = rss end
    assert.is_true(srv:alive(), srv:describe())
    assert.is_true(sent < total, "the server took all 200 MB without pushing back")
    assert.truthy(stalled_since, "the flood never stalled")
    assert.is_true(max_rss <= limit_kb,
      ("RSS grew from %d kB to %d kB (limit %d kB) after %d MB sent"):format(
        rss0, max_rss, limit_kb, math.floor(sent / 1048576)))
    assert.is_true(checks >= 5)
    assert.is_true(worst_rtt < 0.5 * H.scale,
      ("other client waited %.2fs during the flood"):format(worst_rtt))

    -- now read everything back: it must be exactly what was sent
    flood:settimeout(H.T(5))
    local got = 0
    local deadline = H.now() + H.T(30)
    while got < sent and H.now() < deadline do
      local n = math.min(#chunk - got % #chunk, sent - got)
      local data, err = H.read_exact(flood, n, H.T(5))
      assert.truthy(data, ("echo stopped at %d of %d bytes: %s\n%s"):format(
        got, sent, tostring(err), srv:describe()))
      local off = got % #chunk
      assert.is_true(data == chunk:sub(off + 1, off + n),
        ("echoed bytes differ in the %d bytes at offset %d"):format(n, got))
      got = got + n
    end
    assert.equal(sent, got)
    assert.is_true(H.silent_for(flood, 0.2))
    assert.equal(0, srv:stop())
  end)
end)
