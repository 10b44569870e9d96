-- Listener API beyond the basics: port = 0 and l:port(), l:close(), an
-- IPv6 address, and conn:sendfile.
local H = require "spec.helper"

local function has_ipv6()
  local f = io.open("/proc/net/if_inet6")
  if not f then return false end
  local any = f:read("*l") ~= nil
  f:close()
  return any
end

local function start(v6)
  local port = H.free_port()
  local srv = H.start("listener.lua", {
    args = { port, v6 or "none" }, wait_port = port, threads = 1,
  })
  return srv, port
end

describe("listeners", function()
  after_each(H.cleanup)

  it("port = 0 picks a free port that l:port() reports; l:close() stops accepting", function()
    local srv, port = start()
    local p0, addr = srv:wait_stdout("port0 (%d+) (%S+)\n")
    p0 = tonumber(p0)
    assert.is_true(p0 > 0 and p0 ~= port, "l:port() = " .. tostring(p0))
    assert.equal("127.0.0.1", addr)
    assert.is_true(srv:listens_on(p0))
    local c = H.connect(p0)
    assert.equal("zero", H.roundtrip(c, "zero"))

    local ctl = H.connect(port)
    H.send(ctl, "close0\n")
    assert.equal("closed", H.read_line(ctl))
    H.wait_for(function() return not srv:listens_on(p0) end, H.T(3), "port-0 listener to close")
    assert.is_nil((H.try_connect(p0, { timeout = 1 })))
    -- connections accepted before the close go on
    assert.equal("still", H.roundtrip(c, "still"))
    assert.equal(0, srv:stop())
  end)

  it("listens on an IPv6 address", function()
    if not has_ipv6() then pending("no IPv6 on this machine") return end
    local v6 = H.free_port()
    local srv = start(v6)
    srv:wait_stdout("ipv6 " .. v6, nil, true)
    local c = H.connect(v6, { host = "::1" })
    assert.equal("over v6", H.roundtrip(c, "over v6"))
    assert.equal(0, srv:stop())
  end)

  it("sendfile sends a file, or a range of it, in order with writes", function()
    local srv, port = start()
    local path = H.tmpdir() .. "/data.bin"
    local parts = {}
    for i = 1, 20000 do parts[i] = ("%05d,"):format(i) end
    local content = table.concat(parts)                    -- 120 000 bytes
    local f = assert(io.open(path, "wb"))
    f:write(content)
    f:close()

    local c = H.connect(port)
    H.send(c, "file " .. path .. "\n")
    assert.equal(content .. "\nEND\n", H.read_exact(c, #content + 5, H.T(10)))

    H.send(c, "file " .. path .. " 600 60\n")
    assert.equal(content:sub(601, 660) .. "\nEND\n", H.read_exact(c, 65, H.T(5)))

    H.send(c, "file " .. path .. ".missing\n")
    local line = H.read_line(c)
    assert.matches("^ERR .", line)
    assert.equal(0, srv:stop())
  end)
end)
