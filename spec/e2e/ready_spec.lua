-- Spec 13: on_ready fires once a large write has drained to a client that
-- was slow and then read everything.
local H = require "spec.helper"

describe("on_ready", function()
  after_each(H.cleanup)

  -- A small write joins the loop's io_uring batch: pending() says it
  -- waits, and nothing set on_ready for it (a direct write would have
  -- sent it), so a protocol that waits for on_ready then hung.
  it("follows a small write whose bytes pending() reported (the io_uring batch)", function()
    local port = H.free_port()
    local srv = H.start("ready.lua", { args = { port, 1 }, wait_port = port })
    local c = H.connect(port)
    for i = 1, 3 do
      H.send(c, "small\n")
      assert.equal("s", H.read_exact(c, 1, H.T(5)), "round " .. i)
      assert.equal("SMALL DONE", H.read_line(c, H.T(5)), "round " .. i .. ": on_ready never came")
    end
    c:close()
    assert.equal(0, srv:stop())
  end)

  it("fires after a large write drains", function()
    local size = 8 * 1024 * 1024
    local port = H.free_port()
    local srv = H.start("ready.lua", { args = { port, size }, wait_port = port })
    local c = H.connect(port, { rcvbuf = 65536 })
    H.send(c, "big\n")
    local pending = tonumber(srv:wait_stdout("wrote pending (%d+)"))
    assert.is_true(pending > 0, "8 MB went out at once; nothing queued")

    H.sleep(0.5)                                  -- slow client: not reading yet
    assert.is_nil(srv:stdout():find("ready", 1, true),
      "on_ready fired while the queue was full:\n" .. srv:stdout())

    local data = H.read_exact(c, size, H.T(10))
    assert.truthy(data, "did not get the 8 MB")
    assert.is_nil(data:find("[^r]"))
    assert.equal("DONE", H.read_line(c, H.T(5)), "on_ready did not run (no DONE)")
    srv:wait_stdout("ready pending 0", nil, true)
    assert.equal(0, srv:stop())
  end)
end)
