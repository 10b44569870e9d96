-- SPDX-License-Identifier: MIT
-- mp.pg's methods (src/lx/lx_pg.c holds the client and the waits):
-- db:query, db:transaction (tx:transaction is a savepoint), db:pipeline,
-- db:stats, db:close. A table first, db:query({ timeout = ms }, sql, ...),
-- is the query's options.
local core = require("moonport.core")
local C = core.pg -- filled by lx_pg_open before this loads
local check, arm = C.check, C.arm
local acquire_check, acquire_arm, release = C.acquire_check, C.acquire_arm, C.release
local yield, TOKEN = core.raw_yield, core.wait_token
local select, type, error, pcall, unpack = select, type, error, pcall, unpack
local tostring = tostring

local function query(self, ...)
  local ok, err = check(self, ...)
  if not ok then return nil, err end
  return yield(TOKEN, arm, self, ...)
end

local db, tx = {}, {}
local depth = setmetatable({}, { __mode = "k" }) -- tx -> savepoints open
db.query, tx.query = query, query

local function pack(...) return { n = select("#", ...), ... } end

-- Runs fn(t) between `begin` and `commit`, or `rollback` when fn raises
-- (raised again) or returns nil, err (returned as is).
local function run_in(t, fn, begin, commit, rollback)
  local ok, err = query(t, begin)
  if not ok then return nil, err end
  local r = pack(pcall(fn, t))
  if not r[1] then
    query(t, rollback)
    return false, r[2], true
  end
  if r[2] == nil and r.n >= 3 and r[3] ~= nil then
    local _, rerr = query(t, rollback)
    if rerr then return nil, rerr end
    return nil, r[3]
  end
  local _, cerr = query(t, commit)
  if cerr then return nil, cerr end
  return true, r
end

function db:transaction(fn)
  if type(fn) ~= "function" then
    error("bad argument #1 to 'transaction' (function expected, got " .. type(fn) .. ")", 2)
  end
  local ok, err = acquire_check(self)
  if not ok then return nil, err end
  local t, aerr = yield(TOKEN, acquire_arm, self)
  if not t then return nil, aerr end
  local done, r, raised = run_in(t, fn, "BEGIN", "COMMIT", "ROLLBACK")
  -- Reusable only when the transaction surely ended (COMMIT or ROLLBACK
  -- answered); otherwise the connection is closed.
  release(t, done ~= nil or raised == true)
  if raised then error(r, 0) end
  if done == true then return unpack(r, 2, r.n) end
  return nil, r
end

function tx:transaction(fn)
  if type(fn) ~= "function" then
    error("bad argument #1 to 'transaction' (function expected, got " .. type(fn) .. ")", 2)
  end
  local d = (depth[self] or 0) + 1
  depth[self] = d
  local sp = "mp_sp" .. tostring(d)
  local done, r, raised = run_in(self, fn, "SAVEPOINT " .. sp, "RELEASE SAVEPOINT " .. sp,
    "ROLLBACK TO SAVEPOINT " .. sp)
  depth[self] = d - 1
  if raised then error(r, 0) end
  if done == true then return unpack(r, 2, r.n) end
  return nil, r
end

-- db:pipeline([opts,] { {sql, ...}, ... }): every statement sent at once
-- on one connection, one Sync after the last (one round trip, one implicit
-- transaction); a list with, per statement, its rows or { err =,
-- sqlstate =, ... } ("aborted: ..." for those after a failed one).
local pipeline_check, pipeline_arm = C.pipeline_check, C.pipeline_arm
local function pipeline(self, ...)
  local ok, err = pipeline_check(self, ...)
  if not ok then return nil, err end
  return yield(TOKEN, pipeline_arm, self, ...)
end
db.pipeline, tx.pipeline = pipeline, pipeline

-- db:copy_in(sql, iter) / db:copy_out(sql, fn): COPY ... FROM STDIN with
-- the strings iter() returns until nil (any chunking: COPY's text or CSV
-- lines), COPY ... TO STDOUT with fn(chunk) for each chunk of whole rows
-- (up to 64 KiB). Each waits while the other side is slow (nothing piles
-- up in memory) and returns the rows copied, or nil, err, info. On a
-- connection of their own, taken out of pipeline mode for the COPY.
local copy_wait_check, copy_wait_arm = C.copy_wait_check, C.copy_wait_arm
local POLL_READ, POLL_WRITE = 1, 2

local function step(t, f, ev, ...)
  while true do
    local a, b, c = f(t, ...)
    if a ~= false then return a, b, c end
    copy_wait_check(t)
    yield(TOKEN, copy_wait_arm, t, ev)
  end
end

local function copy(self, sql, want, api)
  if type(sql) ~= "string" then
    error("bad argument #1 to '" .. api .. "' (string expected, got " .. type(sql) .. ")", 3)
  end
  local ok, err = acquire_check(self)
  if not ok then return nil, err end
  local t, aerr = yield(TOKEN, acquire_arm, self)
  if not t then return nil, aerr end
  -- once this is answered nothing else is in flight on the connection
  local r, qerr = query(t, "SELECT 1")
  if not r then release(t, false) return nil, qerr end
  local began, berr = C.copy_begin(t, sql)
  if not began then release(t, false) return nil, berr end
  local mode, serr, info = step(t, C.copy_started, POLL_READ)
  if mode ~= want then
    if mode == nil or type(mode) == "number" then
      release(t, serr ~= "closed")
      if mode ~= nil then return nil, "not a COPY statement" end
      return nil, serr, info
    end
    release(t, false) -- a COPY the other way: the connection goes
    return nil, api .. ": not a COPY " .. (want == "in" and "FROM STDIN" or "TO STDOUT")
  end
  return t
end

local function finish(t)
  local n, err, info = step(t, C.copy_finish, POLL_READ)
  release(t, n ~= nil or (err ~= "closed" and err ~= nil))
  return n, err, info
end

function db:copy_in(sql, iter)
  if type(iter) ~= "function" then
    error("bad argument #2 to 'copy_in' (function expected, got " .. type(iter) .. ")", 2)
  end
  local t, err, info = copy(self, sql, "in", "copy_in")
  if not t then return nil, err, info end
  local sent, why = pcall(function()
    while true do
      local chunk = iter()
      if chunk == nil then return end
      if type(chunk) ~= "string" then
        error("copy_in: the iterator returned a " .. type(chunk) .. " (strings only)", 0)
      end
      local ok, perr = step(t, C.copy_put, POLL_WRITE, chunk)
      if not ok then error(perr, 0) end
    end
  end)
  local ended, eerr = step(t, C.copy_end, POLL_WRITE, not sent and tostring(why) or nil)
  if not ended then release(t, false) return nil, eerr end
  local n, ferr, finfo = finish(t)
  if not sent and why ~= "closed" then error(why, 0) end
  return n, ferr, finfo
end

function db:copy_out(sql, fn)
  if type(fn) ~= "function" then
    error("bad argument #2 to 'copy_out' (function expected, got " .. type(fn) .. ")", 2)
  end
  local t, err, info = copy(self, sql, "out", "copy_out")
  if not t then return nil, err, info end
  local okf, ferr = pcall(function()
    while true do
      local chunk, gerr = step(t, C.copy_get, POLL_READ)
      if chunk == true then return end
      if chunk == nil then error(gerr, 0) end
      fn(chunk)
    end
  end)
  if not okf then
    release(t, false) -- mid-COPY: the connection goes
    if ferr == "closed" then return nil, "closed" end
    error(ferr, 0)
  end
  return finish(t)
end

-- db:listen(channel, fn) / db:listen(channel, { publish = "pubsub.channel" }):
-- one LISTEN connection per server, in the root lane (or lane 1 of a
-- one-process server); elsewhere the call does nothing and returns true,
-- so a script's top level can make it in every lane. fn(payload, channel)
-- runs in the elected lane; publish = sends the payload with mp.publish
-- (to every worker's subscribers, WebSockets and SSE streams from C).
local handlers = setmetatable({}, { __mode = "k" }) -- db -> { [channel] = { h... } }

function db:listen(channel, h)
  if type(channel) ~= "string" or #channel == 0 or #channel > 63 then
    error("bad argument #1 to 'listen' (a channel name of 1 to 63 bytes expected)", 2)
  end
  if type(h) == "table" then
    if type(h.publish) ~= "string" then
      error("bad argument #2 to 'listen' ({ publish = channel } expected)", 2)
    end
  elseif type(h) ~= "function" then
    error("bad argument #2 to 'listen' (function or { publish = } expected, got " .. type(h) .. ")", 2)
  end
  if not C.elected() then return true end
  local chans = handlers[self]
  if not chans then chans = {}; handlers[self] = chans end
  local list = chans[channel]
  if not list then list = {}; chans[channel] = list end
  list[#list + 1] = h
  return C.listen(self, channel)
end

local function notify(self, channel, payload)
  local chans = handlers[self]
  local list = chans and chans[channel]
  if not list then return end
  local mp = require("moonport")
  for i = 1, #list do
    local h = list[i]
    if type(h) == "function" then
      local ok, err = pcall(h, payload, channel)
      if not ok then mp.log("error", "pg listen " .. channel .. ": " .. tostring(err)) end
    else
      mp.publish(h.publish, payload)
    end
  end
end

function db:stats() return C.stats(self) end
function db:close() return C.close(self) end

return { db = db, tx = tx, notify = notify }
