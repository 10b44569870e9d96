-- Spec 4: timers (mp.every with a count, mp.after, t:stop(), mp.defer,
-- mp.sleep in a timer) and mp.sleep inside on_data.
local H = require "spec.helper"

-- stdout of timers.lua: "<ms> <event>" lines -> list of {ms=, ev=}
local function events(srv)
  local t = {}
  for _, l in ipairs(srv:stdout_lines()) do
    local ms, ev = l:match("^(%-?%d+) (.*)$")
    if ms then t[#t + 1] = { ms = tonumber(ms), ev = ev } end
  end
  return t
end

local function find(evs, name)
  for i, e in ipairs(evs) do if e.ev == name then return e, i end end
end

local function count(evs, pat)
  local n = 0
  for _, e in ipairs(evs) do if e.ev:find(pat) then n = n + 1 end end
  return n
end

describe("timers", function()
  after_each(H.cleanup)

  it("mp.every(ms, fn, times) without on_done runs times times and logs nothing", function()
    local st, out, err = H.run({ H.fixture("every_count.lua") }, { env = { MOONPORT_WORKERS = "1" } })
    assert.equal(0, st, err)
    assert.equal("tick 1\ntick 2\n", out)
    assert.equal("", err)
  end)

  it("every/after/stop/defer/sleep run as documented", function()
    local srv = H.start("timers.lua", { wait_stdout = "finished\n", timeout = H.T(10) })
    H.sleep(0.3)                                -- would-be late ticks show up
    local evs = events(srv)
    local dump = srv:stdout()

    local start = find(evs, "start")
    assert.truthy(start, dump)
    -- defer: once, with its arguments, as soon as the loop runs
    local d = find(evs, "defer x y")
    assert.truthy(d, dump)
    assert.equal(1, count(evs, "^defer"), dump)
    assert.is_true(d.ms <= start.ms + 1000 * H.T(0.02),
      "defer ran long after the loop started:\n" .. dump)

    -- every(30, fn, 5, on_done): 5 ticks, in order, then on_done once
    assert.equal(5, count(evs, "^tick "), dump)
    for i = 1, 5 do assert.truthy(find(evs, "tick " .. i), dump) end
    local done, doi = find(evs, "ticks done 5")
    assert.truthy(done, dump)
    assert.is_true(doi > select(2, find(evs, "tick 5")), dump)
    assert.equal(1, count(evs, "^ticks done"), dump)
    assert.is_true(find(evs, "tick 5").ms >= 140, "5 ticks of 30 ms took under 140 ms:\n" .. dump)

    -- after(100): once, not early
    assert.equal(1, count(evs, "^after$"), dump)
    assert.is_true(find(evs, "after").ms >= 95, dump)

    -- t:stop() from inside the callback: exactly 3 runs, on_done still runs
    assert.equal(3, count(evs, "^rep %d"), dump)
    assert.truthy(find(evs, "rep done 3"), dump)

    -- t:stop() from another timer: no run after the stop
    local stopped = tonumber(dump:match("forever stopped (%d+)"))
    local final = tonumber(dump:match("forever final (%d+)"))
    assert.truthy(stopped, dump)
    assert.is_true(stopped >= 5, "10 ms timer ran only " .. tostring(stopped) .. " times in 200 ms")
    assert.equal(stopped, final, "timer kept running after t:stop()")

    -- mp.sleep inside a timer callback
    local slept = tonumber(dump:match("timer slept (%d+)"))
    assert.truthy(slept, dump)
    assert.is_true(slept >= 95, dump)

    assert.equal(0, srv:stop())
  end)

  it("mp.sleep in on_data suspends only that callback; the connection's events stay ordered", function()
    local port = H.free_port()
    -- one lane: the other connection must be served by the same loop
    local srv = H.start("sleep.lua", { args = { port }, wait_port = port, threads = 1 })
    local a = H.connect(port)
    local b = H.connect(port)
    assert.equal("echo warm\n", H.roundtrip(b, "warm\n", "echo warm\n"))

    local t0 = H.now()
    assert.is_true(H.send(a, "sleep 800\n"))
    H.sleep(0.1)
    -- sent while a's callback sleeps: must wait for it
    assert.is_true(H.send(a, "after\n"))

    -- b is served meanwhile, promptly
    local t1 = H.now()
    assert.equal("echo ping\n", H.roundtrip(b, "ping\n", "echo ping\n"))
    assert.is_true(H.now() - t1 < 0.5, ("b waited %.2fs"):format(H.now() - t1))
    assert.is_true(H.now() - t0 < 0.75, "b's reply came only after a's sleep ended")

    local line = H.read_line(a, H.T(5))
    assert.truthy(line, "no reply after sleep")
    local ms = tonumber(line:match("^slept (%d+)$"))
    assert.truthy(ms, "first reply is not the sleep's: " .. line)
    assert.is_true(ms >= 790, line)
    assert.is_true(H.now() - t0 >= 0.78)
    assert.equal("echo after", H.read_line(a))
    assert.equal("echo again\n", H.roundtrip(a, "again\n", "echo again\n"))
    assert.equal(0, srv:stop())
  end)
end)

describe("a timeout armed late in a slow callback", function()
  after_each(H.cleanup)

  -- Each was armed from the loop's stamp taken before the callback ran, so
  -- it fired as much early as the callback had run (1.5 s after 1 s of
  -- work: 0.5 s). The bound is a lower one: a loaded machine only adds.
  it("lasts its whole delay: mp.redis connect_timeout, mp.tcp's TLS handshake, mp.wait", function()
    local port = H.free_port()
    H.start("late_timeout.lua", { args = { port }, wait_port = port })
    for what, err in pairs { redis = "connect timeout", tcp = "timeout", wait = "timeout" } do
      local r = H.get_json(port, "/" .. what, H.T(20))
      assert.equal(err, r.err, what)
      assert.is_true(r.ms >= 1495, ("%s: a 1500 ms timeout fired after %d ms"):format(what, r.ms))
      -- and mp.now() moved with the clock across the callback
      assert.is_true(r.now_ms >= 1495, ("%s: mp.now() moved %d ms"):format(what, r.now_ms))
    end
  end)
end)
