-- SPDX-License-Identifier: MIT
-- mp.session { secret =, store =, name =, max_age =, rolling =, cookie = }:
-- router middleware (r:use(mp.session {...})) that gives req.session, a
-- table of JSON values kept between requests, saved before the response's
-- head goes out when it changed (or on every answer with rolling = true).
--
-- store = "cookie" (the default): the session itself is the cookie,
-- sealed with AES-256-GCM (mp.crypto.seal, the cookie's name as associated
-- data, the expiry inside) under a key derived from secret; secret =
-- { new, old, ... } seals with the first and opens with any, for key
-- rotation. store = an mp.shared dictionary or an mp.redis client: the
-- cookie holds only a random id (192 bits), the session is stored under
-- "session:<id>" with max_age as its ttl.
--
-- A cookie that doesn't open (tampered, sealed under a retired key),
-- has expired, is too large or names no stored session gives an empty
-- session, never an error. A session that would make a cookie over 4096
-- bytes is not saved (logged) and the answer goes out without it.
local crypto = require("moonport.crypto")
local json = require("moonport.json")
local cookie = require("moonport.cookie")
local core = require("moonport.core")
local type, error, tostring, pairs, ipairs, setmetatable, pcall, next =
  type, error, tostring, pairs, ipairs, setmetatable, pcall, next
local time = os.time

local M = {}

local MAX_COOKIE = 4096

-- ---- sending the cookie before the head: a hook on res's methods ----

-- Installed in a lane the first time mp.session is called, so that a
-- server without sessions runs res's C methods directly. The hook runs
-- once, before the first method that sends the head; it may wait (a
-- Redis store).
local before = setmetatable({}, { __mode = "k" })
local installed = false
local function install()
  if installed then return end
  installed = true
  local methods = core.http.res_methods
  for _, name in ipairs({ "send", "json", "redirect", "sendfile", "write", "finish", "sse", "_done" }) do
    local c = methods[name]
    methods[name] = function(res, ...)
      local h = before[res]
      if h then
        before[res] = nil
        if not res:sent() then h(res) end
      end
      return c(res, ...)
    end
  end
end

local log
local function warn(msg)
  log = log or require("moonport").log
  log("error", "mp.session: " .. msg)
end

-- ---- options ----

local function keys_of(secret)
  if type(secret) == "string" then secret = { secret } end
  if type(secret) ~= "table" or #secret == 0 then
    error("mp.session: secret must be a string or a list { new, old, ... } (got " .. type(secret) .. ")", 3)
  end
  local keys = {}
  for i, s in ipairs(secret) do
    if type(s) ~= "string" or #s < 32 then
      error("mp.session: each secret must be a string of at least 32 bytes (secret " .. i .. " is not)", 3)
    end
    keys[i] = crypto.hmac("sha256", s, "moonport session key v1")
  end
  return keys
end

local KNOWN = { secret = true, store = true, name = true, max_age = true, rolling = true, cookie = true }

-- ---- stores ----

local ID_OK = "^[%w_-]+$"

local function server_store(store, max_age)
  local is_redis = type(store.cmd) == "function"
  local function key(id) return "session:" .. id end
  return {
    load = function(id)
      if #id ~= 32 or not id:find(ID_OK) then return nil end
      if is_redis then return (store:cmd("GET", key(id))) end
      return store:get(key(id))
    end,
    save = function(id, data)
      if is_redis then return store:cmd("SET", key(id), data, "EX", max_age) end
      return store:set(key(id), data, max_age)
    end,
    delete = function(id)
      if is_redis then return store:cmd("DEL", key(id)) end
      return store:delete(key(id))
    end,
  }
end

function M.new(opts)
  if type(opts) ~= "table" then error("mp.session: takes a table of options (got " .. type(opts) .. ")", 2) end
  for k in pairs(opts) do
    if not KNOWN[k] then error("mp.session: unknown option " .. tostring(k), 2) end
  end
  local name = opts.name or "session"
  if type(name) ~= "string" or not name:find("^[!#$%%&'*+%-.^_`|~%w]+$") then
    error("mp.session: name must be a cookie name (got " .. tostring(name) .. ")", 2)
  end
  local max_age = opts.max_age or 86400
  if type(max_age) ~= "number" or max_age < 1 or max_age % 1 ~= 0 then
    error("mp.session: max_age must be whole seconds (got " .. tostring(max_age) .. ")", 2)
  end
  local rolling = opts.rolling and true or false
  local copts = { path = "/", http_only = true, same_site = "Lax", max_age = max_age }
  if opts.cookie ~= nil then
    if type(opts.cookie) ~= "table" then error("mp.session: cookie must be a table of res:cookie options", 2) end
    for k, v in pairs(opts.cookie) do copts[k] = v end
  end
  -- checked now, at the caller's line, rather than on the first answer
  local ok, err = pcall(cookie.header, name, "x", copts)
  if not ok then error("mp.session: cookie: " .. tostring(err):gsub("^.-res:cookie: ", ""), 2) end
  local clear = {}
  for k, v in pairs(copts) do clear[k] = v end
  clear.max_age, clear.expires = 0, nil

  local store = opts.store or "cookie"
  local keys, srv
  if store == "cookie" then
    keys = keys_of(opts.secret)
  elseif (type(store) == "table" or type(store) == "userdata") and
      (type(store.cmd) == "function" or type(store.get) == "function") then
    srv = server_store(store, max_age)
  else
    error("mp.session: store must be \"cookie\", an mp.shared dictionary or an mp.redis client", 2)
  end
  install()

  -- cookie store: base64url(seal(key, json { d = data, e = expiry }, name))
  local function open_cookie(v)
    if #v > MAX_COOKIE then return nil end
    local sealed = crypto.base64.decode_url(v)
    if not sealed then return nil end
    for _, k in ipairs(keys) do
      local plain = crypto.open(k, sealed, name)
      if plain then
        local t = json.decode(plain)
        if type(t) == "table" and type(t.e) == "number" and t.e > time() and type(t.d) == "table" then
          return t.d
        end
        return nil
      end
    end
    return nil
  end

  local function load(req)
    local v = req.cookies[name]
    if not v then return {}, nil end
    if keys then return open_cookie(v) or {}, nil end
    local data = srv.load(v)
    local t = data and json.decode(data)
    if type(t) == "table" then return t, v end
    return {}, nil
  end

  return function(req, res)
    local data, id = load(req)
    local had = req.cookies[name] ~= nil
    local before_json = next(data) and json.encode(data) or ""
    req.session = data
    -- req.session_regenerate(): a new id (server stores) or a new cookie,
    -- saved with this answer; the old stored session goes (call it at
    -- login, against session fixation)
    req.session_regenerate = function()
      if id then srv.delete(id) end
      id, before_json = nil, nil
    end
    before[res] = function()
      local s = req.session
      if type(s) ~= "table" then s = {} end
      local now_json = next(s) and json.encode(s) or ""
      local changed = now_json ~= before_json
      if not changed and not (rolling and now_json ~= "") then return end
      if now_json == "" then -- emptied: the cookie (and the stored session) go
        if had then
          if id then srv.delete(id) end
          res:cookie(name, "", clear)
        end
        return
      end
      local value
      if keys then
        local sealed, serr = crypto.seal(keys[1], json.encode({ d = s, e = time() + max_age }), name)
        if not sealed then return warn(serr) end
        value = crypto.base64.encode_url(sealed)
      else
        id = id or crypto.base64.encode_url(crypto.random(24))
        local saved, serr = srv.save(id, now_json)
        if not saved then return warn("the store refused the session: " .. tostring(serr)) end
        value = id
      end
      if #value + #name > MAX_COOKIE - 200 then
        return warn(("a session of %d bytes is too large for a cookie: not saved"):format(#now_json))
      end
      res:cookie(name, value, copts)
    end
  end
end

return M
