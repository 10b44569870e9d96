-- SPDX-License-Identifier: MIT
-- mp.limit(opts): request rate limits (GCRA) and concurrency limits that
-- hold across every lane of every worker, kept in an mp.shared dictionary.
--
--   local lim = mp.limit { dict = "limits", rate = "100r/s", burst = 20,
--     key = function(req) return req:peer() end }
--   if not lim(req, res) then return end      -- 429 + Retry-After sent
--   local ok, err, retry_ms = lim:take(key)   -- directly
--
-- A rate decision is one locked step of the dictionary (d:_gcra, over
-- shdict_gcra in src/core/shdict.c): the key's theoretical arrival time
-- is read, moved and stored under the shard's lock, so the count is exact
-- however many lanes and workers ask at once, and no lock is held across
-- a wait. A concurrency slot is d:incr up (and down again when full), and
-- d:incr down when the request ends (lua/moonport/http.lua runs req._ends
-- after the handler, however it ended).
local type, tostring, tonumber, error, pcall, setmetatable = type, tostring, tonumber, error, pcall, setmetatable
local rawget, rawset, ceil = rawget, rawset, math.ceil

-- The decision through the FFI when it can be had (moonport_shared_gcra,
-- src/lx/lx_shared.c: the prefix and the key joined in C, no Lua string
-- and no C API call per decision); d:_gcra otherwise.
local gcra, wait_buf
do
  local ok, ffi = pcall(require, "ffi")
  if ok and os.getenv("MOONPORT_SHARED_FFI") ~= "0" then
    local declared = pcall(ffi.cdef, [[
int moonport_shared_gcra(void *h, const char *p, size_t pl, const char *k,
                         size_t kl, double interval_us, double tolerance_us,
                         double n, double *wait_us);
]])
    local found, fn = pcall(function() return ffi.C.moonport_shared_gcra end)
    if declared and found then gcra, wait_buf = fn, ffi.new("double[1]") end
  end
end

local Limit = {}
Limit.__index = Limit
local count = 0 -- mp.limit calls in this lane: default names agree across lanes

local UNITS = { s = 1, m = 60, h = 3600, d = 86400 }

-- "100r/s", "10r/m", "5r/h" or a number (per second): requests per second
local function per_second(rate)
  if type(rate) == "number" then
    if rate > 0 then return rate end
  elseif type(rate) == "string" then
    local n, unit = rate:match("^(%d+%.?%d*)r/([smhd])$")
    n = tonumber(n)
    if n and n > 0 then return n / UNITS[unit] end
  end
  error("mp.limit: rate is like \"100r/s\", \"10r/m\" or a number per second, not " .. tostring(rate), 3)
end

local function key_of(self, key)
  if type(key) ~= "string" then
    if type(key) ~= "number" then error("mp.limit: the key is a string or a number", 3) end
    key = tostring(key)
  end
  return self.prefix .. key
end

-- lim:take(key [, n]) -> true, delay_ms | nil, "rejected", retry_after_ms
function Limit:take(key, n)
  if not self.interval then error("lim:take: this limit has no rate", 2) end
  n = n or 1
  if type(n) ~= "number" or n <= 0 then error("lim:take: n must be a number > 0", 2) end
  if gcra then
    local tk = type(key)
    if tk ~= "string" then
      if tk ~= "number" then error("lim:take: the key is a string or a number", 2) end
      key = tostring(key)
    end
    local p = self.prefix
    local rc = gcra(self.dict, p, #p, key, #key, self.interval, self.tolerance, n, wait_buf)
    if rc == 1 then return true, wait_buf[0] / 1000 end
    if rc == 0 then return nil, "rejected", ceil(wait_buf[0] / 1000) end
    return nil, rc == -36 and "key too long" or "dictionary error " .. rc
  end
  local ok, wait = self.dict:_gcra(key_of(self, key), self.interval, self.tolerance, n)
  if ok then return true, wait / 1000 end
  if ok == nil then return nil, wait end
  return nil, "rejected", ceil(wait / 1000)
end

-- lim:enter(key) -> true | nil, "rejected"; lim:leave(key) gives it back
function Limit:enter(key)
  if not self.concurrent then error("lim:enter: this limit has no concurrent", 2) end
  local k = "c" .. key_of(self, key)
  local v, err = self.dict:incr(k, 1, 0)
  if not v then return nil, err end
  if v > self.concurrent then
    self.dict:incr(k, -1, 0)
    return nil, "rejected"
  end
  return true
end

function Limit:leave(key)
  if not self.concurrent then error("lim:leave: this limit has no concurrent", 2) end
  local k = "c" .. key_of(self, key)
  local v = self.dict:incr(k, -1, 0)
  if v and v <= 0 then self.dict:delete(k) end
end

local function too_many(res, retry_s)
  res:status(429):header("retry-after", tostring(retry_s))
  res:header("content-type", "text/plain; charset=utf-8")
  res:send("429 Too Many Requests\n")
end

-- lim(req, res [, next]): the middleware. true when the request may go on
-- (then next(), if given, is called and its results returned); false
-- after answering 429 with Retry-After.
function Limit.__call(self, req, res, nxt)
  local key = self.key(req)
  if key == nil then
    if nxt then return nxt() end
    return true
  end
  if self.interval then
    local ok, err, retry = self:take(key)
    if not ok then
      if err ~= "rejected" then error("mp.limit: " .. tostring(err), 2) end
      too_many(res, retry and ceil(retry / 1000) or 1)
      return false
    end
    if self.delay and err > 0 then self.sleep(err) end
  end
  if self.concurrent then
    local ok, err = self:enter(key)
    if not ok then
      if err ~= "rejected" then error("mp.limit: " .. tostring(err), 2) end
      too_many(res, 1)
      return false
    end
    local ends = rawget(req, "_ends")
    if not ends then
      ends = {}
      rawset(req, "_ends", ends)
    end
    ends[#ends + 1] = function() self:leave(key) end
  end
  if nxt then return nxt() end
  return true
end

return function(o)
  if type(o) ~= "table" then error("mp.limit: options table expected", 2) end
  local mp = require("moonport")
  count = count + 1
  local self = setmetatable({}, Limit)
  if type(o.dict) ~= "string" then error("mp.limit: dict is the name of an mp.shared dictionary", 2) end
  local ok, d = pcall(mp.shared, o.dict)
  if not ok then d = mp.shared(o.dict, { size = o.size or "8m" }) end
  self.dict = d
  local name = o.name or ("limit" .. count)
  if type(name) ~= "string" then error("mp.limit: name is a string", 2) end
  self.prefix = name .. "|"
  if o.rate ~= nil then
    local r = per_second(o.rate)
    self.interval = 1e6 / r
    local burst = o.burst or 0
    if type(burst) ~= "number" or burst < 0 or burst % 1 ~= 0 then
      error("mp.limit: burst is a whole number >= 0", 2)
    end
    self.tolerance = burst * self.interval
    self.delay = o.delay and true or false
    if self.delay then self.sleep = mp.sleep end
  elseif o.burst ~= nil or o.delay ~= nil then
    error("mp.limit: burst and delay go with a rate", 2)
  end
  if o.concurrent ~= nil then
    local c = o.concurrent
    if type(c) ~= "number" or c < 1 or c % 1 ~= 0 then error("mp.limit: concurrent is a whole number >= 1", 2) end
    self.concurrent = c
  end
  if not self.interval and not self.concurrent then
    error("mp.limit: give a rate, a concurrent limit or both", 2)
  end
  self.key = o.key or function(req) return (req:peer()) end
  if type(self.key) ~= "function" then error("mp.limit: key must be a function(req)", 2) end
  return self
end
