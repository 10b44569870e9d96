-- Spec: mp.session through the real binary with curl (a cookie jar):
-- cookie sessions sealed with AES-256-GCM and key rotation, a shared
-- dictionary store holding only an id in the cookie, saving only when the
-- session changed (or always with rolling), and tampered, expired,
-- oversized and unknown cookies giving an empty session.
local H = require "spec.helper"
local cjson = require "cjson"

local start, cleanup = H.fixture_servers("session_app.lua")

local K1, K2 = ("1"):rep(32), ("2"):rep(40)

local function curl(jar, url, extra)
  local p = assert(io.popen(("/usr/bin/curl -s -i --max-time 10 -b %s -c %s %s '%s' 2>&1"):format(
    jar, jar, extra or "", url)))
  local out = p:read("*a")
  p:close()
  local head, body = out:match("^(.-)\r\n\r\n(.*)$")
  local cookies = {}
  for v in (head or ""):gmatch("\r\n[Ss]et%-[Cc]ookie:%s*([^\r\n]*)") do cookies[#cookies + 1] = v end
  return tonumber(out:match("^HTTP/1%.1 (%d+)")), body, cookies
end

-- the value of cookie `name` in a curl cookie jar
local function jar_value(jar, name)
  for line in (H.read_file(jar) or ""):gmatch("[^\n]+") do
    local n, v = line:match("\t([^\t]+)\t([^\t]*)$")
    if n == name then return v end
  end
end

describe("mp.session (end to end)", function()
  after_each(cleanup)
  local srv, port, sport, rport, shport, dir
  local function boot(secrets)
    sport, rport, shport = H.free_port(), H.free_port(), H.free_port()
    srv, port = start({ secrets, sport, rport, shport }, { workers = 1 })
    H.wait_for(function() return srv:listens_on(shport) end, H.T(5), "the last port")
  end
  local function u(p, path) return "http://127.0.0.1:" .. p .. path end
  before_each(function() dir = H.tmpdir() end)

  it("a cookie session counts across requests, saved only when it changed", function()
    boot(K1)
    local jar = dir .. "/jar"
    local st, body, set = curl(jar, u(port, "/get"))
    assert.equal(200, st)
    assert.same({ n = cjson.null }, cjson.decode(body))
    assert.same({}, set, "an untouched empty session sets no cookie")
    for i = 1, 3 do
      body, set = select(2, curl(jar, u(port, "/inc")))
      assert.same({ n = i }, cjson.decode(body))
      assert.equal(1, #set)
      assert.truthy(set[1]:find("^sid=[%w_-]+; Path=/; Max%-Age=86400; HttpOnly; SameSite=Lax$"), set[1])
    end
    body, set = select(2, curl(jar, u(port, "/get")))
    assert.same({ n = 3 }, cjson.decode(body))
    assert.same({}, set, "unchanged: not saved again")
    -- the value is sealed: nothing of the session shows
    local v = jar_value(jar, "sid")
    assert.falsy(v:find("n", 1, true) and v:find("3", 1, true) and #v < 30)
    -- a handler that answers nothing still saves; one that raises does not
    curl(jar, u(port, "/quiet"))
    assert.same({ n = 99 }, cjson.decode((select(2, curl(jar, u(port, "/get"))))))
    st = curl(jar, u(port, "/boom"))
    assert.equal(500, st)
    assert.same({ n = 99 }, cjson.decode((select(2, curl(jar, u(port, "/get"))))))
    -- emptied: the cookie is cleared
    body, set = select(2, curl(jar, u(port, "/clear")))
    assert.equal("cleared", body)
    assert.truthy(set[1] and set[1]:find("^sid=; Path=/; Max%-Age=0"), tostring(set[1]))
    assert.same({ n = cjson.null }, cjson.decode((select(2, curl(jar, u(port, "/get"))))))
  end)

  it("tampered, unknown, oversized and expired cookies give an empty session, not an error", function()
    boot(K1)
    local jar = dir .. "/jar"
    curl(jar, u(port, "/inc"))
    local v = jar_value(jar, "sid")
    -- a character of the sealed value changed at a few places (not the
    -- last: its low bits may be padding that base64 decoding drops)
    for _, at in ipairs({ 1, 10, 20, math.floor(#v / 2), #v - 2, #v - 1 }) do
      local c = v:sub(at, at)
      local t = v:sub(1, at - 1) .. (c == "A" and "B" or "A") .. v:sub(at + 1)
      local st, body = curl(dir .. "/none", u(port, "/get"), "-H 'Cookie: sid=" .. t .. "'")
      assert.equal(200, st)
      assert.same({ n = cjson.null }, cjson.decode(body), "flipped at " .. at)
    end
    for _, bad in ipairs({ "", "x", "not-base64!", ("A"):rep(5000), v .. v }) do
      local st, body = curl(dir .. "/none", u(port, "/get"), "-H 'Cookie: sid=" .. bad .. "'")
      assert.equal(200, st)
      assert.same({ n = cjson.null }, cjson.decode(body))
    end
    -- the original still works
    local st, body = curl(jar, u(port, "/get"))
    assert.equal(200, st)
    assert.same({ n = 1 }, cjson.decode(body))
    -- a session too large for a cookie is not saved; the answer goes out
    local set
    st, body, set = curl(jar, u(port, "/big?n=5000"))
    assert.equal(200, st)
    assert.equal("big", body)
    assert.same({}, set)
    srv:wait_stderr("too large for a cookie: not saved", H.T(5), true)
    assert.same({ n = 1 }, cjson.decode((select(2, curl(jar, u(port, "/get"))))))
    -- max_age = 1: sealed with its expiry, which the cookie's Max-Age can't be trusted for
    local sjar = dir .. "/short"
    curl(sjar, u(shport, "/inc"))
    local sv = jar_value(sjar, "session")
    assert.truthy(sv)
    H.wait_for(function()
      return (select(2, curl(dir .. "/none", u(shport, "/get"), "-H 'Cookie: session=" .. sv .. "'"))) ==
        '{"n":null}'
    end, H.T(5), "the sealed expiry to pass", 0.25)
  end)

  it("key rotation: { new, old } opens both and seals with the new; dropping the old empties its sessions", function()
    -- cleanup() takes the temporary folders too: the cookies are passed by hand
    local function get(cookie_value, path)
      local jar = H.tmpdir() .. "/jar"
      local st, body, set = curl(jar, u(port, path or "/get"), "-H 'Cookie: sid=" .. cookie_value .. "'")
      assert.equal(200, st)
      local v = set[1] and set[1]:match("^sid=([^;]*)")
      return cjson.decode(body), v
    end
    boot(K1)
    local _, old = get("none", "/inc")
    assert.truthy(old)
    cleanup()
    boot(K2 .. "," .. K1)
    assert.same({ n = 1 }, (get(old)), "the old key still opens")
    local body, new = get(old, "/inc")
    assert.same({ n = 2 }, body)
    assert.truthy(new)
    assert.not_equal(old, new)
    cleanup()
    boot(K2)
    assert.same({ n = 2 }, (get(new)))
    assert.same({ n = cjson.null }, (get(old)), "sealed under a retired key")
  end)

  it("a shared-dictionary store keeps only a random id in the cookie", function()
    boot(K1)
    local jar, jar2 = dir .. "/jar", dir .. "/jar2"
    for i = 1, 2 do
      local _, body, set = curl(jar, u(sport, "/inc"))
      assert.same({ n = i }, cjson.decode(body))
      assert.truthy(set[1]:find("^session=[%w_-]+; Path=/; Max%-Age=600; HttpOnly; SameSite=Lax$"), set[1])
    end
    local id = jar_value(jar, "session")
    assert.equal(32, #id)
    curl(jar2, u(sport, "/inc"))
    assert.not_equal(id, jar_value(jar2, "session"))
    assert.same({ n = 2 }, cjson.decode((select(2, curl(jar, u(sport, "/get"))))))
    -- an id the store doesn't have, or a malformed one: empty
    for _, bad in ipairs({ ("A"):rep(32), "short", id:sub(1, 31) .. "!" }) do
      local st, body = curl(dir .. "/none", u(sport, "/get"), "-H 'Cookie: session=" .. bad .. "'")
      assert.equal(200, st)
      assert.same({ n = cjson.null }, cjson.decode(body))
    end
    -- regenerated (at login): a new id, the old one gone from the store
    curl(jar, u(sport, "/login"))
    local id2 = jar_value(jar, "session")
    assert.equal(32, #id2)
    assert.not_equal(id, id2)
    local st, body = curl(dir .. "/none", u(sport, "/get"), "-H 'Cookie: session=" .. id .. "'")
    assert.equal(200, st)
    assert.same({ n = cjson.null }, cjson.decode(body))
    assert.same({ n = 2 }, cjson.decode((select(2, curl(jar, u(sport, "/get"))))))
    id = id2
    -- cleared: gone from the store too
    curl(jar, u(sport, "/clear"))
    st, body = curl(dir .. "/none", u(sport, "/get"), "-H 'Cookie: session=" .. id .. "'")
    assert.equal(200, st)
    assert.same({ n = cjson.null }, cjson.decode(body))
  end)

  it("rolling = true saves on every answer, with the cookie options given", function()
    boot(K1)
    local jar = dir .. "/jar"
    curl(jar, u(rport, "/inc"))
    local _, body, set = curl(jar, u(rport, "/get"))
    assert.same({ n = 1 }, cjson.decode(body))
    assert.equal(1, #set)
    assert.truthy(set[1]:find("; SameSite=Strict$"), set[1])
  end)

  it("an mp.redis store: the session under session:<id> with max_age as its ttl", function()
    local redis_bin = H.exists("/usr/bin/redis-server") and "/usr/bin/redis-server" or "/usr/sbin/redis-server"
    assert(H.exists(redis_bin), "no redis-server (scripts/setup --test installs it)")
    local rp = H.free_port()
    local redis = H.spawn({ redis_bin, "--port", tostring(rp), "--bind", "127.0.0.1", "--save", "",
      "--appendonly", "no", "--daemonize", "no", "--dir", "/tmp", "--loglevel", "warning" })
    H.wait_for(function() return H.is_listening(rp) end, H.T(10), function() return redis:describe() end)
    local hp
    sport, rport, shport, hp = H.free_port(), H.free_port(), H.free_port(), H.free_port()
    srv, port = start({ K1, sport, rport, shport, rp, hp }, { workers = 1 })
    H.wait_for(function() return srv:listens_on(hp) end, H.T(5), "the redis store's port")
    local jar = dir .. "/jar"
    for i = 1, 2 do
      local _, body = curl(jar, u(hp, "/inc"))
      assert.same({ n = i }, cjson.decode(body))
    end
    local id = jar_value(jar, "rsid")
    assert.equal(32, #id)
    local st, out = H.exec({ "/usr/bin/redis-cli", "-p", rp, "GET", "session:" .. id })
    assert.equal(0, st)
    assert.equal('{"n":2}\n', out)
    st, out = H.exec({ "/usr/bin/redis-cli", "-p", rp, "TTL", "session:" .. id })
    assert.equal(0, st)
    assert.truthy(tonumber(out) > 500 and tonumber(out) <= 600, out)
    curl(jar, u(hp, "/clear"))
    st, out = H.exec({ "/usr/bin/redis-cli", "-p", rp, "EXISTS", "session:" .. id })
    assert.equal(0, st)
    assert.equal("0\n", out)
  end)
end)
