-- SPDX-License-Identifier: MIT
-- Unit specs of lua/moonport/addrfilter.lua (the deny / allow check of
-- mp.tcp and mp.fetch): pure Lua, no server. The e2e use is
-- spec/e2e/fetch_spec.lua ("deny").
local af = require "moonport.addrfilter"

describe("addrfilter", function()
  it("parses IPv4 and IPv6 (with ::, an embedded quad, IPv4-mapped as IPv4) and refuses what inet_pton would", function()
    local b, v4 = af.parse("127.0.0.1")
    assert.is_true(v4)
    assert.same({ 127, 0, 0, 1 }, { b[13], b[14], b[15], b[16] })
    b, v4 = af.parse("::ffff:127.0.0.1")
    assert.is_true(v4)
    assert.equal(127, b[13])
    b, v4 = af.parse("::FFFF:7f00:1")
    assert.is_true(v4)
    assert.same({ 127, 0, 0, 1 }, { b[13], b[14], b[15], b[16] })
    b, v4 = af.parse("fe80::1")
    assert.is_false(v4)
    assert.same({ 0xfe, 0x80, 1 }, { b[1], b[2], b[16] })
    for _, bad in ipairs { "127.1", "2130706433", "127.0.0.1.", "1.2.3.256", "01.2.3.4", "::1::", "1:2:3:4:5:6:7:8:9",
        "g::1", "", "localhost", "1:2:3:4:5:6:7" } do
      assert.is_nil(af.parse(bad), bad)
    end
  end)

  it("denies by name and CIDR, on the IPv4 form of a mapped address too; allow has the last word", function()
    local f = assert(af.new({ "loopback", "private", "link-local", "unspecified", "198.51.100.0/24", "2001:db8::/32" }))
    local cases = {
      ["127.0.0.1"] = "loopback", ["127.255.1.2"] = "loopback", ["::1"] = "loopback",
      ["::ffff:127.0.0.1"] = "loopback", ["10.9.8.7"] = "private", ["172.16.0.1"] = "private",
      ["172.31.255.255"] = "private", ["192.168.1.1"] = "private", ["fd00::1"] = "private",
      ["100.64.0.1"] = "private", ["169.254.169.254"] = "link-local", ["fe80::1"] = "link-local",
      ["0.0.0.0"] = "unspecified", ["::"] = "unspecified", ["198.51.100.7"] = "198.51.100.0/24",
      ["2001:db8:1::5"] = "2001:db8::/32",
    }
    for ip, why in pairs(cases) do
      local ok, r = f(ip)
      assert.is_false(ok, ip)
      assert.equal(why, r, ip)
    end
    for _, ip in ipairs { "93.184.216.34", "172.32.0.1", "172.15.255.255", "11.0.0.1", "2606:4700::1", "::2" } do
      assert.is_true((f(ip)), ip)
    end
    local g = assert(af.new(nil, function(ip) return ip == "93.184.216.34" end))
    assert.is_true((g("93.184.216.34")))
    assert.same({ false, "allow said no" }, { g("93.184.216.35") })
    assert.same({ false, "not an address: nope" }, { g("nope") })
    assert.is_nil(af.new({ "nowhere" }))
    assert.is_nil(af.new({ "10.0.0.0/33" }))
    assert.is_nil(af.new({ "::/129" }))
    assert.is_nil(af.new("loopback"))
    assert.is_nil(af.new(nil, "yes"))
  end)
  it("the lane's default: used when a call gives neither, replaced by a call's own, off with deny = false", function()
    assert.same({}, { af.pick(nil, nil) }) -- none set
    assert.is_nil(select(1, af.set_default({ "nowhere" })))
    assert.same({}, { af.pick(nil, nil) }) -- a bad one changes nothing
    local fn = function() return true end
    assert.is_true(af.set_default({ "loopback" }, fn))
    local d, a = af.pick(nil, nil)
    assert.same({ { "loopback" }, fn }, { d, a })
    d, a = af.pick({ "private" }, nil)
    assert.same({ { "private" } }, { d, a })
    d, a = af.pick(false, nil)
    assert.same({}, { d, a })
    assert.is_true(af.set_default(nil, nil))
    assert.same({}, { af.pick(nil, nil) })
  end)
end)
