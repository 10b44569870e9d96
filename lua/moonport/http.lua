-- SPDX-License-Identifier: MIT
-- The Lua half of running an mp.http handler (src/lx/lx_http.c runs these
-- in the request's coroutine): `build` makes the request table from the
-- parts C pushes (a constructor with constant keys is one template copy,
-- cheaper than a lua_setfield per field), `run` calls on_request and
-- finishes its response (500 for an error), `upgrade` calls
-- websocket.on_upgrade and accepts the upgrade unless the handler answered.
local RMT = require("moonport.request")
local cookie = require("moonport.cookie")
local core = require("moonport.core")
local HMT = require("moonport.headers")
local xpcall, pcall, traceback, setmetatable = xpcall, pcall, debug.traceback, setmetatable
local metric, now -- moonport.metric and mp.now, once a route was timed
local type, pairs, error, tostring = type, pairs, error, tostring

-- res's methods written in Lua (the C ones: src/lx/lx_http.c)
core.http.res_methods.cookie = cookie.set

local function build(method, path, query, target, version, headers, body, id, x)
  return setmetatable({ method = method, path = path, query = query,
    target = target, version = version,
    headers = setmetatable(headers, HMT), body = body, conn_id = id,
    _xid = x, _ends = false, route = false, _t0 = false }, RMT)
end

-- The end of run: a function of its own so that the JIT compiles it. A
-- handler that waited (up:proxy, mp.fetch) comes back into run's frame
-- in the interpreter, which would run everything after the xpcall there
-- (about 500 instructions of a proxied request, callgrind).
local function finish(req, res, ok, err)
  if not ok then
    -- an HTTP error (req:parts' 400 and 413): that answer, not a 500
    if type(err) == "table" and err.http_status then
      if not res:sent() then
        res:status(err.http_status):send(err.message .. "\n")
        ok = true
      else
        err = err.message
      end
    end
  end
  if ok then res:_done() else res:_fail(tostring(err), req.id) end
  -- set by mp.router's match, with req._t0; false in the template, as
  -- _ends below: a field the table lacks would run RMT's __index (about
  -- 500 instructions a request, callgrind)
  local route = req.route
  if route then
    local t0 = req._t0
    if not metric then metric, now = require("moonport.metric"), require("moonport").now end
    metric.route(route, res:_status(), (now() - t0) / 1000)
  end
  -- what must end with the request however it ended (mp.limit's
  -- concurrency slots, lua/moonport/limit.lua). A field of the table's
  -- template (false until limit.lua sets it), read as one: rawget here
  -- was a fast-function call in the interpreter, about 100 instructions
  -- of every request (callgrind, hello)
  local ends = req._ends
  if ends then
    for i = 1, #ends do pcall(ends[i]) end
  end
end

local function run(handler, res, method, path, query, target, version,
                   headers, body, id, x)
  local req = build(method, path, query, target, version, headers, body, id, x)
  local ok, err = xpcall(handler, traceback, req, res)
  return finish(req, res, ok, err)
end

local function upgrade(handler, res, method, path, query, target, version,
                       headers, body, id, x)
  local req = build(method, path, query, target, version, headers, body, id, x)
  local ok, v = xpcall(handler, traceback, req, res)
  if ok then ok, v = pcall(res._upgrade, res, v) end
  if not ok then res:_fail(tostring(type(v) == "table" and v.message or v), req.id) end
end

-- res:render(file, ctx [, status]): an mp.template page, sent as text/html.
-- The other response methods are lx_http.c's; this one is Lua, added to
-- the same method table (the response metatable lx_http_open registered).
local template = require("moonport.template")
local res_methods = debug.getregistry()["moonport.http.response"].__index
function res_methods.render(res, file, ctx, status)
  local ok, body = pcall(template.render, file, ctx)
  if not ok then error(body, 2) end
  if status then res:status(status) end
  res:header("Content-Type", "text/html; charset=utf-8")
  return res:send(body)
end

-- mp.http { status = { path =, allow = fn } }: on_request behind a check
-- of the metrics path (src/lx/lx_http.c wraps it so): a GET or HEAD of
-- `path` is answered with mp.metrics() when allow(req) says yes, 403
-- otherwise; anything else goes to on_request (404 without one).
local function status_guard(path, allow, handler)
  local metrics = require("moonport").metrics
  return function(req, res)
    if req.path == path and (req.method == "GET" or req.method == "HEAD") then
      if not allow(req) then return res:status(403):send("Forbidden\n") end
      return res:header("Content-Type", "text/plain; version=0.0.4; charset=utf-8"):send(metrics())
    end
    if handler then return handler(req, res) end
    return res:status(404):send("Not Found\n")
  end
end


-- ---- mp.http's options that Lua handles ----

local TYPES = { html = "text/html; charset=utf-8", htm = "text/html; charset=utf-8",
  json = "application/json", txt = "text/plain; charset=utf-8", xml = "application/xml" }

local log -- mp.log, found on first use
local function log_error(req, err)
  log = log or require("moonport").log
  local ip, port = req:peer()
  log("error", ("error in on_request: %s %s from %s:%s (request id %s): %s"):format(req.method,
    req.target, tostring(ip), tostring(port), req.id, tostring(err)))
end

-- error_pages = { [status] = "file" | fn(req, res, err) }: files go to C
-- (opts._pages, for the answers C gives) and answer the handler's errors
-- too; functions answer the handler's errors (500, and req:parts' 400 and
-- 413). Raises at the caller of mp.http for a bad entry.
local function pages_of(v)
  if type(v) ~= "table" then
    error("mp.http: error_pages must be a table { [status] = file or function } (got " .. type(v) .. ")", 4)
  end
  local pages, fns = {}, {}
  local dir = package.loaded.moonport and package.loaded.moonport.script_dir
  for status, page in pairs(v) do
    if type(status) ~= "number" or status % 1 ~= 0 or status < 400 or status > 599 then
      error("mp.http: error_pages takes statuses 400 to 599 (got " .. tostring(status) .. ")", 4)
    end
    if type(page) == "function" then
      fns[status] = page
    elseif type(page) == "string" then
      local path = page
      if dir and path:sub(1, 1) ~= "/" then path = dir .. "/" .. path end
      local f, err = io.open(path, "rb")
      if not f then error("mp.http: error_pages[" .. status .. "]: " .. tostring(err), 4) end
      local body = f:read("*a")
      f:close()
      local ext = path:match("%.(%w+)$")
      pages[status] = { body = body, type = TYPES[ext and ext:lower()] or "text/plain; charset=utf-8" }
    else
      error("mp.http: error_pages[" .. status .. "] must be a file name or a function (got " ..
        type(page) .. ")", 4)
    end
  end
  return pages, fns
end

local function with_pages(handler, pages, fns)
  return function(req, res)
    local ok, err = xpcall(handler, traceback, req, res)
    if ok then return end
    local status = type(err) == "table" and err.http_status or 500
    local fn, page = fns[status], pages[status]
    if res:sent() or not (fn or page) then error(err, 0) end
    local msg = type(err) == "table" and err.message or err
    res:_drop_type() -- the page says what it is
    if fn then
      local ok2, err2 = xpcall(fn, traceback, req, res, err)
      if not ok2 then log_error(req, "in error_pages[" .. status .. "]: " .. tostring(err2)) end
      if res:sent() then
        if status == 500 then log_error(req, msg) end
        return
      end
      if not page then error(err, 0) end
    end
    if status == 500 then log_error(req, msg) end
    res:status(status):header("Content-Type", page.type):send(page.body)
  end
end

-- request_id = true wraps on_request so that every request's id goes back
-- as X-Request-Id and onto its access-log line; error_pages as above.
-- Returns opts, or a copy.
local function options(opts)
  if type(opts) ~= "table" or (opts.request_id == nil and opts.error_pages == nil) then return opts end
  if opts.request_id ~= nil and type(opts.request_id) ~= "boolean" then
    error("mp.http: request_id must be a boolean (got " .. type(opts.request_id) .. ")", 3)
  end
  local out = {}
  for k, v in pairs(opts) do out[k] = v end
  local handler = opts.on_request
  if opts.error_pages ~= nil then
    local pages, fns = pages_of(opts.error_pages)
    out._pages = pages
    if handler ~= nil then handler = with_pages(handler, pages, fns) end
  end
  if opts.request_id and handler ~= nil then
    local inner = handler
    handler = function(req, res)
      local id = req.id
      res:header("X-Request-Id", id):_id(id)
      return inner(req, res)
    end
  end
  out.on_request = handler
  return out
end

return { run = run, build = build, upgrade = upgrade, status_guard = status_guard, options = options }
