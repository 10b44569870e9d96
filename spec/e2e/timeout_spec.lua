-- Spec 5: idle timeout without a handler closes (reason "timeout"); with
-- on_timeout the handler runs and the connection stays.
local H = require "spec.helper"

describe("idle timeout", function()
  after_each(H.cleanup)

  local function start()
    local plain, ping = H.free_port(), H.free_port()
    local srv = H.start("timeout.lua", { args = { plain, ping }, wait_port = ping })
    H.wait_for(function() return srv:listens_on(plain) end, H.T(5), "plain listener")
    return srv, plain, ping
  end

  it("closes an idle connection with reason timeout", function()
    local srv, plain = start()
    local c = H.connect(plain)
    local t0 = H.now()
    local data, err = H.read_to_eof(c, H.T(6))
    local took = H.now() - t0
    assert.equal("", data, "expected EOF, got " .. tostring(err))
    assert.is_true(took >= 0.8, ("closed after %.2fs, before the 1 s timeout"):format(took))
    assert.is_true(took <= 3 * H.scale, ("closed after %.2fs"):format(took))
    srv:wait_stdout("close plain timeout", nil, true)
    assert.equal(0, srv:stop())
  end)

  it("activity restarts the idle clock", function()
    local srv, plain = start()
    local c = H.connect(plain)
    local t0 = H.now()
    for i = 1, 5 do                                   -- 2 s of activity
      H.sleep(0.4)
      assert.equal("k" .. i, H.roundtrip(c, "k" .. i), "closed while active")
    end
    assert.is_true(H.now() - t0 >= 2)
    assert.is_nil(srv:stdout():find("close plain", 1, true), srv:stdout())
    local data = H.read_to_eof(c, H.T(6))
    assert.equal("", data)
    srv:wait_stdout("close plain timeout", nil, true)
    assert.equal(0, srv:stop())
  end)

  it("runs on_timeout and keeps the connection", function()
    local srv, _, ping = start()
    local c = H.connect(ping)
    local t0 = H.now()
    assert.equal("ping 1", H.read_line(c, H.T(6)))
    local t1 = H.now() - t0
    assert.is_true(t1 >= 0.8 and t1 <= 3 * H.scale, ("first ping after %.2fs"):format(t1))
    assert.equal("ping 2", H.read_line(c, H.T(6)))
    local t2 = H.now() - t0
    assert.is_true(t2 - t1 >= 0.8, ("second ping %.2fs after the first"):format(t2 - t1))
    assert.is_nil(srv:stdout():find("close ping", 1, true), srv:stdout())
    c:close()
    srv:wait_stdout("close ping peer", nil, true)
    assert.equal(0, srv:stop())
  end)
end)
