-- spec/protocols.lua: the protocols an HTTP-semantics case runs over, so
-- that one case proves mp.http's Lua API is the same whatever the client
-- speaks. Each protocol is a way to start the fixture and a way to run curl
-- against it:
--   HTTP/1.1       plain, curl --http1.1
--   h2c            plain with h2c = true, curl --http2-prior-knowledge
--   h2             HTTPS (the test CA), ALPN h2, curl --http2
--
--   local P = require "spec.protocols"
--   P.each(function(proto)
--     it("... over " .. proto.name, function()
--       local base = proto.start(start, { "max_body=4096" })  -- the fixture
--       local r = proto.curl_i { base .. "/hello" }          -- parsed answer
--       assert.equal(proto.version, r.version)              -- "1.1" or "2"
--     end)
--   end)
local H = require "spec.helper"
local assert = require "luassert"

local P = {}

local CURL = "/usr/bin/curl"

local ca -- one test CA for the run (made on first use)
local function test_ca()
  if not ca or not H.exists(ca.ca) then ca = H.test_ca { "localhost" } end
  return ca
end

--- Runs curl with `args` (after the protocol's own). Returns exit status,
--- stdout, stderr.
local function run_curl(proto, args, timeout)
  local argv = { CURL, "-sS", "--noproxy", "*", "--max-time", tostring(H.T(10)) }
  for _, a in ipairs(proto.curl_args) do argv[#argv + 1] = a end
  for _, a in ipairs(args) do argv[#argv + 1] = tostring(a) end
  local p = H.spawn(argv)
  local st = p:wait_exit(timeout or H.T(20))
  if not st then
    p:kill(H.SIGKILL)
    p:wait_exit(5)
    error("curl did not finish: " .. table.concat(argv, " "), 3)
  end
  p.sanitizer_checked = true
  return st, p:stdout(), p:stderr()
end

--- Parses curl -i output (its last response, 1xx skipped): { status,
--- version ("1.1", "2"), headers (lower-case names, repeats joined with
--- ", "), list (name/value pairs), body }.
function P.parse(out)
  local r
  while true do
    local head_end = out:find("\r\n\r\n", 1, true)
    assert.truthy(head_end, "no head in curl output: " .. out:sub(1, 300))
    local head = out:sub(1, head_end - 1)
    out = out:sub(head_end + 4)
    local version, status = head:match("^HTTP/([%d%.]+) (%d%d%d)")
    assert.truthy(status, "bad status line: " .. head:sub(1, 100))
    r = { status = tonumber(status), version = version == "1.1" and "1.1" or version,
          headers = {}, list = {} }
    for line in head:gmatch("\r\n([^\r\n]*)") do
      local k, v = line:match("^([^:%s]+):[ \t]*(.-)[ \t]*$")
      if k then
        k = k:lower()
        r.list[#r.list + 1] = { k, v }
        r.headers[k] = r.headers[k] and (r.headers[k] .. ", " .. v) or v
      end
    end
    if r.status >= 200 then break end
  end
  r.body = out
  return r
end

local function make(name, version, curl_args, extra, tls)
  local proto = { name = name, version = version, curl_args = curl_args, tls = tls }
  --- Starts the fixture with `start` (H.fixture_servers' start) and the
  --- options this protocol needs besides `opts`; returns the base URL,
  --- the server and its port.
  function proto.start(start, opts, sopts)
    local o = {}
    for _, x in ipairs(opts or {}) do o[#o + 1] = x end
    for _, x in ipairs(extra) do o[#o + 1] = x end
    if tls then
      local c = test_ca()
      o[#o + 1] = "tls_cert=" .. c.localhost.cert
      o[#o + 1] = "tls_key=" .. c.localhost.key
      proto.curl_args = { "--http2", "--cacert", c.ca }
    end
    local srv, port = start(o, sopts)
    if tls then
      proto.curl_args[#proto.curl_args + 1] = "--resolve"
      proto.curl_args[#proto.curl_args + 1] = "localhost:" .. port .. ":127.0.0.1"
    end
    return ("%s://%s:%d"):format(tls and "https" or "http", tls and "localhost" or "127.0.0.1", port),
      srv, port
  end
  function proto.curl(args, timeout) return run_curl(proto, args, timeout) end
  function proto.curl_i(args, timeout)
    local a = { "-i" }
    for _, x in ipairs(args) do a[#a + 1] = x end
    local st, out, err = run_curl(proto, a, timeout)
    assert.equal(0, st, "curl " .. table.concat(args, " ") .. " failed: " .. err)
    local r = P.parse(out)
    assert.equal(version, r.version, "the protocol curl spoke")
    return r
  end
  return proto
end

P.list = {
  make("HTTP/1.1", "1.1", { "--http1.1" }, {}),
  make("h2c (prior knowledge)", "2", { "--http2-prior-knowledge" }, { "h2c=true" }),
  make("h2 (TLS, ALPN)", "2", { "--http2" }, {}, true),
}

--- Calls fn(proto) for each protocol.
function P.each(fn)
  for _, proto in ipairs(P.list) do fn(proto) end
end

return P
