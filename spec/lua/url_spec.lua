-- Unit specs of lua/moonport/url.lua (mp.fetch's URL parsing and redirect
-- resolution): pure Lua, no server. The e2e use is spec/e2e/fetch_spec.lua.
local url = require "moonport.url"

describe("url.parse", function()
  it("host, port, target and the Host header's authority", function()
    local u = url.parse("http://example.com/a/b?q=1")
    assert.same({ scheme = "http", host = "example.com", port = 80, target = "/a/b?q=1",
                  authority = "example.com" }, u)
    u = url.parse("HTTP://h:8080")
    assert.same({ "h", 8080, "/", "h:8080" }, { u.host, u.port, u.target, u.authority })
    u = url.parse("http://h?x=1#frag")
    assert.equal("/?x=1", u.target)
    u = url.parse("http://h:80/p#f")
    assert.same({ "/p", "h" }, { u.target, u.authority })
  end)

  it("IPv6 literals", function()
    local u = url.parse("http://[::1]:9000/x")
    assert.same({ "::1", 9000, "[::1]:9000" }, { u.host, u.port, u.authority })
    u = url.parse("http://[fe80::1]/")
    assert.same({ "fe80::1", 80, "[fe80::1]" }, { u.host, u.port, u.authority })
    assert.is_nil(url.parse("http://[zz]/"))
    assert.is_nil(url.parse("http://[127.0.0.1]/"))
  end)

  it("https waits for TLS; other schemes and bad URLs are nil, err", function()
    assert.same({ nil, "https needs TLS (not yet)" }, { url.parse("https://h/") })
    assert.truthy(select(2, url.parse("ftp://h/")):match("unsupported scheme"))
    for _, bad in ipairs { "h/x", "http://", "http://:80/", "http://h:0/", "http://h:65536/",
                           "http://h:x/", "http://u@h/", "http://h/a b", "http://h/\r\n" } do
      local u, err = url.parse(bad)
      assert.is_nil(u, bad)
      assert.is_string(err)
    end
    assert.is_nil(url.parse(42))
  end)
end)

describe("url.resolve", function()
  local base = "http://h:8/a/b/c?q=1"
  it("absolute, scheme-relative and absolute-path locations", function()
    assert.equal("http://o/x", url.resolve(base, "http://o/x"))
    assert.equal("https://o/x", url.resolve(base, "https://o/x"))
    assert.equal("http://o/p", url.resolve(base, "//o/p"))
    assert.equal("http://h:8/z?k", url.resolve(base, "/z?k"))
  end)
  it("relative paths against the base's directory, dot segments removed", function()
    assert.equal("http://h:8/a/b/d", url.resolve(base, "d"))
    assert.equal("http://h:8/a/b/d", url.resolve(base, "./d"))
    assert.equal("http://h:8/a/d", url.resolve(base, "../d"))
    assert.equal("http://h:8/d", url.resolve(base, "../../../../d"))
    assert.equal("http://h:8/a/b/", url.resolve(base, "."))
    assert.equal("http://h:8/a/", url.resolve(base, ".."))
    assert.equal("http://h:8/a/b/c?new", url.resolve(base, "?new"))
    assert.equal("http://h:8/a/b/c?q=1", url.resolve(base, ""))
    assert.equal("http://h/x", url.resolve("http://h", "x"))
  end)
  it("remove_dots", function()
    assert.equal("/a/g", url.remove_dots("/a/b/c/./../../g"))
    assert.equal("/mid/6", url.remove_dots("/mid/content=5/../6"))
    assert.equal("/", url.remove_dots("/.."))
  end)
end)
