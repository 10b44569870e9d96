-- Spec: the four batteries in one handler (spec/fixtures/batteries_app.lua)
-- under -w 2 -t 2, driven by curl: a login checks the name with mp.re and
-- the password with scrypt, issues an HS256 JWT (verified here by jose)
-- and an AES-GCM sealed cookie; /me checks both (in whichever lane the
-- connection lands) and renders an mp.template page.
local H = require "spec.helper"
local JS = require "spec.js"
local cjson = require "cjson"

local start, cleanup = H.fixture_servers("batteries_app.lua")
local SECRET = ("5e"):rep(32)

local function curl(port, args)
  local argv = { "/usr/bin/curl", "-s", "-i" }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local st, out = H.exec(argv)
  assert.equal(0, st)
  local status = tonumber(out:match("^HTTP/1%.1 (%d+)"))
  local head, body = out:match("^(.-)\r\n\r\n(.*)$")
  return status, head or "", body or ""
end

local function login(port, user, password)
  return curl(port, { "-X", "POST", "-H", "Content-Type: application/json",
    "--data", cjson.encode({ user = user, password = password }),
    "http://127.0.0.1:" .. port .. "/login" })
end

describe("the batteries in one handler", function()
  after_each(cleanup)

  it("logs in, verifies and renders across workers and lanes (-w 2 -t 2)", function()
    local _, port = start({ SECRET }, { workers = 2, threads = 2 })
    local st, head, body = login(port, "Ada.Lovelace@Example.org", "open sesame")
    assert.equal(200, st, body)
    local token = cjson.decode(body).token
    local sid = head:match("[Ss]et%-[Cc]ookie: sid=([%w_-]+)")
    assert.truthy(sid, head)

    if H.exists(JS.node) then
      local out = JS.run("jwt_cases.mjs", { "hs", SECRET, token }, 30)[1]
      assert.is_true(out.ok, tostring(out.err))
      assert.equal("ada.lovelace@example.org", out.payload.sub)
    end

    -- new connections land on every worker and lane; each verifies
    local lanes = {}
    H.wait_for(function()
      local s, _, page = curl(port, { "-H", "Authorization: Bearer " .. token,
        "-H", "Cookie: theme=dark; sid=" .. sid,
        "http://127.0.0.1:" .. port .. "/me?text=%23lua%20and%20%23c%3Cscript%3E" })
      assert.equal(200, s, page)
      assert.truthy(H.plain(page, '<p id="user">ada.lovelace@example.org</p>'), page)
      assert.truthy(H.plain(page, '<p id="domain">example.org</p>'), page)
      assert.truthy(H.plain(page, "<li>lua</li><li>c</li>"), page)
      assert.truthy(H.plain(page, "<title>ada.lovelace@example.org</title>"), page)
      lanes[page:match('<p id="lane">([%d/]+)</p>')] = true
      local n = 0
      for _ in pairs(lanes) do n = n + 1 end
      return n >= 3
    end, H.T(30), function() return "three lanes reached, " .. cjson.encode(lanes) end, 0)
  end)

  it("refuses bad names, passwords, tokens and cookies", function()
    local _, port = start({ SECRET }, { workers = 2, threads = 2 })
    local st, _, body = login(port, "x@y", "open sesame")
    assert.equal(401, st)
    assert.equal("bad user name\n", body)
    st, _, body = login(port, "ada@example.org", "open sesame!")
    assert.equal(401, st)
    assert.equal("bad password\n", body)
    local head
    st, head, body = login(port, "ada@example.org", "open sesame")
    assert.equal(200, st)
    local token = cjson.decode(body).token
    local sid = head:match("[Ss]et%-[Cc]ookie: sid=([%w_-]+)")
    local function me(tok, cookie)
      local s, _, b = curl(port, { "-H", "Authorization: Bearer " .. tok, "-H", "Cookie: sid=" .. cookie,
        "http://127.0.0.1:" .. port .. "/me" })
      return s, b
    end
    assert.equal(200, (me(token, sid)))
    local h, p, s = token:match("^([^.]+)%.([^.]+)%.([^.]+)$")
    local forged = h .. "." .. p:sub(1, -3) .. (p:sub(-2) == "fQ" and "fR" or "fQ") .. "." .. s
    local code, why = me(forged, sid)
    assert.equal(401, code)
    assert.truthy(why:match("^token: "), why)
    local none = "eyJhbGciOiJub25lIn0." .. p .. "."
    code, why = me(none, sid)
    assert.equal(401, code)
    assert.equal("token: alg none refused\n", why)
    local flipped = sid:sub(1, 20) .. (sid:sub(21, 21) == "A" and "B" or "A") .. sid:sub(22)
    code, why = me(token, flipped)
    assert.equal(401, code)
    assert.equal("cookie: bad tag\n", why)
  end)
end)
