-- SPDX-License-Identifier: MIT
-- mp.spawn, mp.join, mp.wait_any, t:kill and mp.semaphore: coroutines of
-- one lane that run side by side (src/lx/lx_task.c holds the C half).
--
-- A task runs fn(...) at once, in its own pooled coroutine, until its
-- first wait; then mp.spawn returns. Waiting for another coroutine is a
-- park (C.park_new, C.park(p [, ms]), C.unpark(p, v)): the waiter parks,
-- whoever it waits for unparks it, and it runs again on the loop's next
-- turn with v (nil, "timeout" when ms passed first).
local core = require("moonport.core")
local C = core.task
local park, park_new, unpark, check = C.park, C.park_new, C.unpark, C.check
local select, type, setmetatable, error, next = select, type, setmetatable, error, next
local unpack = unpack or table.unpack -- luacheck: ignore 143

local Task = {}
Task.__index = Task
Task.__metatable = "moonport.task"

local seq = 0 -- finishing order, for wait_any

-- Ends task t with result r (a table: values and n, or nil, err and err)
-- and wakes everyone waiting for it.
local function finish(t, r)
  if t.result then return end
  seq = seq + 1
  t.seq, t.result = seq, r
  local ws = t.waiters
  t.waiters = nil
  for p in next, ws do unpark(p, t) end
end

local function failed(err) return { nil, err, n = 2, err = err } end

local function pack(...) return { n = select("#", ...), ... } end

local function body(t, fn, ...)
  local r = pack(fn(...))
  if r[1] == nil and r[2] ~= nil then r.err = r[2] end -- returned nil, err
  C.done(t.c)
  finish(t, r)
end

-- The runner logged the error already (src/lx/lx_lane.c).
function C.on_fail(t, err) finish(t, failed(err)) end

local function is_task(t) return getmetatable(t) == "moonport.task" end

local function spawn(fn, ...)
  if type(fn) ~= "function" then
    error("mp.spawn: a function expected, got " .. type(fn), 2)
  end
  check("mp.spawn")
  local t = setmetatable({ c = C.new(), waiters = {} }, Task)
  C.run(t.c, body, t, fn, ...)
  return t
end

-- "running", "done", "failed" or "killed".
function Task:status()
  local r = self.result
  if not r then return "running" end
  if r.err == "killed" then return "killed" end
  return r.err and "failed" or "done"
end

-- Ends the task for good wherever it waits: joiners see nil, "killed".
-- A task killing itself ends there (kill does not return). Returns
-- "cancelled" when the task's wait was cut short (sleep, join, r:cmd,
-- mp.tcp, mp.resolve, mp.wait ...), "dropped" when its wait can't be (the
-- event it waits for is dropped when it comes), nothing for an ended task.
function Task:kill()
  if self.result then return end
  local what = C.kill(self.c)
  if what == "done" then return end
  local on_kill = self.on_kill
  self.on_kill = nil
  if on_kill then on_kill() end
  finish(self, failed("killed"))
  if what == "self" then C.selfkill() end
  return what
end

-- The tasks and options of join / wait_any: (t1, t2, ...) or
-- ({t1, t2, ...} [, { timeout = ms }]); the third result says which.
local function args(api, ...)
  local list, opts = ...
  local as_list = not is_task(list) and type(list) == "table"
  if as_list then
    if opts ~= nil and type(opts) ~= "table" then
      error(api .. ": options must be a table", 3)
    end
  else
    list, opts = { ... }, nil
  end
  if #list == 0 then error(api .. ": no task given", 3) end
  for i = 1, #list do
    if not is_task(list[i]) then
      error(("%s: argument %d is not a task (%s)"):format(api, i, type(list[i])), 3)
    end
  end
  local ms = opts and opts.timeout
  if ms ~= nil and (type(ms) ~= "number" or ms < 0) then
    error(api .. ": timeout must be a number of milliseconds >= 0", 3)
  end
  check(api)
  return list, ms, as_list
end

local now = C.now

-- Waits in p until one of `list` finishes or the deadline passes; true, or
-- nil, "timeout".
local function wait_some(list, p, deadline)
  for i = 1, #list do
    local ws = list[i].waiters
    if ws then ws[p] = true end
  end
  local me = C.current()
  if me then
    me.on_kill = function()
      for i = 1, #list do
        local ws = list[i].waiters
        if ws then ws[p] = nil end
      end
    end
  end
  local ms = deadline and math.max(0, deadline - now())
  local ok, err = park(p, ms)
  if me then me.on_kill = nil end
  for i = 1, #list do
    local ws = list[i].waiters
    if ws then ws[p] = nil end
  end
  return ok and true, err
end

-- mp.join(t1, t2, ...) -> r1, r2, ...; mp.join({t1, ...} [, opts]) -> {r1, ...}
-- (a list: any number of tasks); nil, "timeout" past opts.timeout.
local function join(...)
  local list, ms, as_list = args("mp.join", ...)
  local deadline = ms and now() + ms
  local p = park_new()
  while true do
    local left = false
    for i = 1, #list do
      if not list[i].result then left = true break end
    end
    if not left then break end
    local ok, err = wait_some(list, p, deadline)
    if not ok then return nil, err end
  end
  local out = {}
  for i = 1, #list do out[i] = list[i].result end
  if as_list then return out end
  return unpack(out, 1, #list)
end

local function wait_any(...)
  local list, ms = args("mp.wait_any", ...)
  local deadline = ms and now() + ms
  local p = park_new()
  while true do
    local first
    for i = 1, #list do
      local t = list[i]
      if t.result and (not first or t.seq < first.seq) then first = t end
    end
    if first then return first, first.result end
    local ok, err = wait_some(list, p, deadline)
    if not ok then return nil, err end
  end
end

-- ---- semaphores ----

local Sem = {}
Sem.__index = Sem
Sem.__metatable = "moonport.semaphore"

local function semaphore(n)
  n = n == nil and 1 or n
  if type(n) ~= "number" or n < 0 or n % 1 ~= 0 then
    error("mp.semaphore: a whole number >= 0 expected", 2)
  end
  -- queue: parks in arrival order, from head to tail
  -- granted: parks a permit is on its way to
  return setmetatable({ count = n, queue = {}, head = 1, tail = 0, granted = {} }, Sem)
end

local function sem_remove(s, p)
  for i = s.head, s.tail do
    if s.queue[i] == p then s.queue[i] = false return end
  end
end

-- s:wait([ms]) -> true, or nil, "timeout". FIFO: a permit posted while
-- others wait goes to the one waiting longest.
function Sem:wait(ms)
  if getmetatable(self) ~= "moonport.semaphore" then
    error("s:wait: call it as s:wait([ms])", 2)
  end
  if ms ~= nil and (type(ms) ~= "number" or ms < 0) then
    error("s:wait: timeout must be a number of milliseconds >= 0", 2)
  end
  check("s:wait")
  if self.count > 0 and self.head > self.tail then
    self.count = self.count - 1
    return true
  end
  local p = park_new()
  self.tail = self.tail + 1
  self.queue[self.tail] = p
  local me = C.current()
  if me then
    -- killed waiting, or killed with a permit on its way: not lost
    me.on_kill = function()
      sem_remove(self, p)
      if self.granted[p] then self.granted[p] = nil self:post() end
    end
  end
  local ok, err = park(p, ms)
  if me then me.on_kill = nil end
  if ok then
    self.granted[p] = nil
    return true
  end
  sem_remove(self, p)
  return nil, err
end

-- s:post([k]): k permits (1), each to the longest waiter or kept.
function Sem:post(k)
  if getmetatable(self) ~= "moonport.semaphore" then
    error("s:post: call it as s:post([k])", 2)
  end
  k = k == nil and 1 or k
  if type(k) ~= "number" or k < 1 or k % 1 ~= 0 then
    error("s:post: a whole number >= 1 expected", 2)
  end
  for _ = 1, k do
    local given = false
    while self.head <= self.tail do
      local p = self.queue[self.head]
      self.queue[self.head] = nil
      self.head = self.head + 1
      if p and unpark(p, true) then
        self.granted[p] = true
        given = true
        break
      end
    end
    if not given then self.count = self.count + 1 end
  end
end

-- The number of permits free now.
function Sem:available() return self.count end

return function(mp)
  mp.spawn = spawn
  mp.join = join
  mp.wait_any = wait_any
  mp.semaphore = semaphore
end
