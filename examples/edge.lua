-- An edge in front of two pools of application servers: TLS termination,
-- /api/ and the rest balanced separately with health checks, a rate limit
-- per client address, WebSockets passed through, metrics.
--
--   moonport -w 2 examples/edge.lua
--   EDGE_CERT=site.pem EDGE_KEY=site.key moonport -w 2 examples/edge.lua
--
-- Without EDGE_CERT the edge serves plain HTTP on 8080 (for a try-out);
-- the upstream addresses come from EDGE_API and EDGE_WEB
-- ("host:port,host:port").
local mp = require "moonport"

local function list(env, default)
  local out = {}
  for a in (os.getenv(env) or default):gmatch("[^,]+") do out[#out + 1] = a end
  return out
end

mp.shared("limits", { size = "16m" })

local api = mp.upstream {
  name = "api",
  servers = list("EDGE_API", "127.0.0.1:9001,127.0.0.1:9002"),
  balance = "least_conn",
  timeout = 10000, retries = 2,
  check = { path = "/health", interval = 2000, fails = 2, passes = 2 },
}
local web = mp.upstream {
  name = "web",
  servers = list("EDGE_WEB", "127.0.0.1:9101"),
  balance = "hash", key = function(req) return req.headers.cookie end,
  check = { path = "/", interval = 5000 },
}

-- 20 requests a second per address, 40 at once; the API also 4 at once
-- per address
local per_ip = mp.limit { dict = "limits", rate = "20r/s", burst = 40 }
local api_slots = mp.limit { dict = "limits", concurrent = 4 }

local function edge(req, res)
  if not per_ip(req, res) then return end
  if req.path:sub(1, 5) == "/api/" then
    if not api_slots(req, res) then return end
    return api:proxy(req, res, { path = req.path:sub(5), headers = { ["X-Edge"] = "1" } })
  end
  return web:proxy(req, res)
end

local cert, key = os.getenv("EDGE_CERT"), os.getenv("EDGE_KEY")
if cert then
  mp.http { port = 443, tls = { cert = cert, key = key }, stream_body = true,
    max_body = 1024 * 1024 * 1024, on_request = edge }
  -- plain HTTP only sends clients to HTTPS, and serves the metrics
  mp.http { port = 80, status = "/metrics", on_request = function(req, res)
    res:redirect("https://" .. (req.headers.host or "localhost") .. req.target, 301)
  end }
else
  mp.http { port = 8080, status = "/metrics", stream_body = true,
    max_body = 1024 * 1024 * 1024, on_request = edge }
end
