-- SPDX-License-Identifier: MIT
-- mp.cors { origins =, methods =, headers =, expose =, credentials =,
-- max_age = }: router middleware (r:use(mp.cors {...})) for cross-origin
-- requests (the Fetch standard's CORS protocol). A preflight (OPTIONS with
-- Access-Control-Request-Method) is answered here, 204; other requests
-- get their Access-Control-Allow-Origin and go on to the route.
local type, error, tostring, ipairs, concat, lower, find, sub =
  type, error, tostring, ipairs, table.concat, string.lower, string.find, string.sub

local M = {}

local function list(v, name, default)
  if v == nil then return default end
  if type(v) == "string" then v = { v } end
  if type(v) ~= "table" then
    error("mp.cors: " .. name .. " must be a list of strings (got " .. type(v) .. ")", 3)
  end
  for _, s in ipairs(v) do
    if type(s) ~= "string" or find(s, "[%c,]") or s == "" then
      error("mp.cors: " .. name .. " holds a bad entry (" .. tostring(s) .. ")", 3)
    end
  end
  return concat(v, ", ")
end

-- The allowed origins as a test: "*" (any), an exact origin
-- ("https://a.example"), "*.b.example" (any scheme, any subdomain of
-- b.example), "https://*.b.example", or a function(origin) -> boolean.
local function matcher(origins)
  if origins == "*" then return function() return true end, true end
  if type(origins) == "function" then return origins, false end
  if type(origins) == "string" then origins = { origins } end
  if type(origins) ~= "table" or #origins == 0 then
    error("mp.cors: origins must be \"*\", a list of origins or a function (got " ..
      tostring(origins) .. ")", 3)
  end
  local exact, suffixes = {}, {}
  for _, o in ipairs(origins) do
    if type(o) ~= "string" or o == "" or o == "*" or find(o, "[%s,/]$") then
      error("mp.cors: a bad origin in origins (" .. tostring(o) .. ")", 3)
    end
    local scheme, rest = o:match("^(%a[%w+.-]*://)%*(%..+)$")
    if not scheme then rest = o:match("^%*(%..+)$") end
    if rest then
      suffixes[#suffixes + 1] = { scheme = scheme, suffix = lower(rest) }
    else
      exact[lower(o)] = true
    end
  end
  return function(origin)
    local o = lower(origin)
    if exact[o] then return true end
    for _, s in ipairs(suffixes) do
      local n = #s.suffix
      local host_start = (find(o, "://", 1, true) or -2) + 3
      if sub(o, -n) == s.suffix and #o - n >= host_start
        and (not s.scheme or sub(o, 1, #s.scheme) == s.scheme)
        and not find(sub(o, host_start, #o - n), "[/@]") then
        return true
      end
    end
    return false
  end, false
end

function M.new(opts)
  if type(opts) ~= "table" then
    error("mp.cors: takes a table of options (got " .. type(opts) .. ")", 2)
  end
  local allowed, any = matcher(opts.origins)
  local credentials = opts.credentials and true or false
  if any and credentials then
    error("mp.cors: credentials = true can't go with origins = \"*\" (list the origins)", 2)
  end
  local methods = list(opts.methods, "methods", "GET, HEAD, PUT, PATCH, POST, DELETE")
  local headers = list(opts.headers, "headers", nil)
  local expose = list(opts.expose, "expose", nil)
  local max_age = opts.max_age
  if max_age ~= nil and (type(max_age) ~= "number" or max_age < 0 or max_age % 1 ~= 0) then
    error("mp.cors: max_age must be whole seconds (got " .. tostring(max_age) .. ")", 2)
  end
  max_age = max_age and tostring(max_age)

  return function(req, res)
    local h = req.headers
    local origin = h.origin
    -- the answer depends on Origin unless every origin gets "*"
    if not any then res:header("Vary", "Origin") end
    if not origin then return end
    local preflight = req.method == "OPTIONS" and h["access-control-request-method"]
    if not allowed(origin) then
      if preflight then return res:status(204):send() end
      return
    end
    res:header("Access-Control-Allow-Origin", any and "*" or origin)
    if credentials then res:header("Access-Control-Allow-Credentials", "true") end
    if not preflight then
      if expose then res:header("Access-Control-Expose-Headers", expose) end
      return
    end
    res:header("Access-Control-Allow-Methods", methods)
    local want = headers or h["access-control-request-headers"]
    if want and want ~= "" and not find(want, "[\r\n]") then
      res:header("Access-Control-Allow-Headers", want)
      if not headers and not any then res:header("Vary", "Access-Control-Request-Headers") end
    end
    if max_age then res:header("Access-Control-Max-Age", max_age) end
    return res:status(204):send()
  end
end

return M
