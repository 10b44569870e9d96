-- Unit specs of lua/moonport/task.lua's semaphore and join logic over a
-- fake of its C half (core.task): parks are plain coroutines resumed by a
-- tiny scheduler here, so no server runs. The real primitives are proven
-- end to end by spec/e2e/task_spec.lua.

local function fake_core()
  local F = { queue = {}, clock = 0, current_co = nil }
  local parked = {} -- park -> coroutine waiting in it
  function F.park_new() return {} end
  function F.park(p, ms)
    assert(not parked[p], "already waiting")
    parked[p] = coroutine.running()
    p.ms = ms
    return coroutine.yield()
  end
  function F.unpark(p, v)
    local co = parked[p]
    if not co then return false end
    parked[p] = nil
    F.queue[#F.queue + 1] = { co, v }
    return true
  end
  function F.timeout(p) -- what the C timer does: resumes at once
    local co = parked[p]
    parked[p] = nil
    assert(coroutine.resume(co, nil, "timeout"))
  end
  function F.drop(p) parked[p] = nil end -- what a kill does to a park
  function F.parked() local n = 0 for _ in pairs(parked) do n = n + 1 end return n end
  function F.check() end
  function F.current() return nil end
  function F.now() return F.clock end
  -- the loop's next turn: every wake queued so far
  function F.turn()
    local q = F.queue
    F.queue = {}
    for _, e in ipairs(q) do assert(coroutine.resume(e[1], e[2])) end
    return #q
  end
  return F
end

describe("task.lua semaphore", function()
  local mp, F
  before_each(function()
    F = fake_core()
    package.loaded["moonport.core"] = { task = F }
    package.loaded["moonport.task"] = nil
    mp = {}
    require("moonport.task")(mp)
  end)

  local function go(fn, ...) local co = coroutine.create(fn) assert(coroutine.resume(co, ...)) return co end

  it("hands permits to waiters in arrival order, never more than n at once", function()
    local s = mp.semaphore(2)
    local got = {}
    for i = 1, 5 do go(function() assert(s:wait()) got[#got + 1] = i end) end
    assert.same({ 1, 2 }, got)
    assert.equal(0, s:available())
    assert.equal(3, F.parked())
    s:post()
    s:post()
    assert.same({ 1, 2 }, got)     -- woken on the next turn, not inside post
    F.turn()
    assert.same({ 1, 2, 3, 4 }, got)
    s:post(3)                      -- one waiter left: two permits are kept
    F.turn()
    assert.same({ 1, 2, 3, 4, 5 }, got)
    assert.equal(2, s:available())
  end)

  it("a waiter that timed out or was dropped does not take a permit", function()
    local s = mp.semaphore(0)
    local res = {}
    local p1, p2
    go(function() res[1] = { s:wait(50) } end)
    p1 = s.queue[s.tail]
    go(function() res[2] = { s:wait() } end)
    p2 = s.queue[s.tail]
    go(function() res[3] = { s:wait() } end)
    F.timeout(p1)
    assert.same({ nil, "timeout" }, res[1])
    F.drop(p2)                      -- killed
    s:post()
    F.turn()
    assert.same({ true }, res[3])
    assert.is_nil(res[2])
    assert.equal(0, s:available())
    assert.equal(50, p1.ms)
  end)

  it("a permit is taken at once when free and nobody waits", function()
    local s = mp.semaphore(1)
    local r
    go(function() r = { s:wait(), s:wait(10) } end)
    assert.is_true(r == nil)
    assert.equal(1, F.parked())
    s:post()
    F.turn()
    assert.same({ true, true }, r)
  end)

  it("raises on misuse", function()
    assert.has_error(function() mp.semaphore(-1) end, "mp.semaphore: a whole number >= 0 expected")
    assert.has_error(function() mp.semaphore(1.5) end, "mp.semaphore: a whole number >= 0 expected")
    local s = mp.semaphore(1)
    assert.has_error(function() s:post(0) end, "s:post: a whole number >= 1 expected")
    assert.has_error(function() s.wait({}) end, "s:wait: call it as s:wait([ms])")
    assert.has_error(function() s:wait(-1) end, "s:wait: timeout must be a number of milliseconds >= 0")
  end)

  it("join and wait_any reject what is not a task", function()
    assert.has_error(function() mp.join(1) end, "mp.join: argument 1 is not a task (number)")
    assert.has_error(function() mp.join({}) end, "mp.join: no task given")
    assert.has_error(function() mp.wait_any({ {} }) end, "mp.wait_any: argument 1 is not a task (table)")
    assert.has_error(function() mp.spawn(nil) end, "mp.spawn: a function expected, got nil")
  end)
end)
