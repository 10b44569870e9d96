-- The Lua half of running an mp.http handler (src/lx/lx_http.c runs these
-- in the request's coroutine): `build` makes the request table from the
-- parts C pushes (a constructor with constant keys is one template copy,
-- cheaper than a lua_setfield per field), `run` calls on_request and
-- finishes its response (500 for an error), `upgrade` calls
-- websocket.on_upgrade and accepts the upgrade unless the handler answered.
local RMT = require("moonport.request")
local HMT = require("moonport.headers")
local xpcall, pcall, traceback, setmetatable = xpcall, pcall, debug.traceback, setmetatable

local function build(method, path, query, target, minor, headers, body, id, seq)
  return setmetatable({ method = method, path = path, query = query,
    target = target, version = minor == 0 and "1.0" or "1.1",
    headers = setmetatable(headers, HMT), body = body, conn_id = id,
    _seq = seq }, RMT)
end

local function run(handler, res, method, path, query, target, minor,
                   headers, body, id, seq)
  local req = build(method, path, query, target, minor, headers, body, id, seq)
  local ok, err = xpcall(handler, traceback, req, res)
  if ok then res:_done() else res:_fail(err) end
end

local function upgrade(handler, res, method, path, query, target, minor,
                       headers, body, id, seq)
  local req = build(method, path, query, target, minor, headers, body, id, seq)
  local ok, v = xpcall(handler, traceback, req, res)
  if ok then ok, v = pcall(res._upgrade, res, v) end
  if not ok then res:_fail(v) end
end

return { run = run, build = build, upgrade = upgrade }
