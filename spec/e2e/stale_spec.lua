-- Spec 11: a handle kept after its connection closed is harmless: write
-- returns nil, "closed", and connections that reuse the file descriptor get
-- nothing from it (and are not closed by it).
local H = require "spec.helper"

describe("stale connection handles", function()
  after_each(H.cleanup)

  it("never reach a new connection on the reused fd", function()
    local port = H.free_port()
    local delay = math.floor(1500 * H.scale)
    local srv = H.start("stale.lua", { args = { port, delay }, wait_port = port })
    local a = H.connect(port)
    assert.equal("a", H.roundtrip(a, "a"))
    local id = srv:wait_stdout("open (%S+)\n")
    a:close()
    srv:wait_stdout("close " .. id .. " peer", nil, true)

    -- new connections now take the lowest free fds: the old one among them
    local fresh = {}
    for i = 1, 8 do
      fresh[i] = H.connect(port)
      assert.equal("n" .. i, H.roundtrip(fresh[i], "n" .. i))
    end
    assert.is_nil(srv:stdout():find("stale write", 1, true),
      "the timer fired before the new connections were set up; test is too slow")

    srv:wait_stdout("stale done", H.T(5) + delay / 1000, true)
    local line = srv:stdout():match("stale write [^\n]*")
    assert.equal("stale write nil closed peer nil open false", line)

    for i, c in ipairs(fresh) do
      local ok, what = H.silent_for(c, 0.1)
      assert.is_true(ok, ("new connection %d: %s"):format(i, tostring(what)))
      assert.equal("again" .. i, H.roundtrip(c, "again" .. i),
        "new connection " .. i .. " broken by the stale handle")
    end
    assert.is_true(srv:alive())
    assert.equal(0, srv:stop())
  end)
end)
