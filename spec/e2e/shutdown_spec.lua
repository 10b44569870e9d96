-- Spec 6: graceful shutdown on SIGTERM / SIGINT / mp.stop(): every client
-- gets what on_shutdown wrote, then EOF; stop handlers run; exit 0. A
-- connection that cannot drain is cut at the grace deadline.
local H = require "spec.helper"

-- Index of the first line matching pat (or nil).
local function line_index(lines, pat)
  for i, l in ipairs(lines) do if l:find(pat) then return i end end
end

local function check_order(srv)
  -- each lane's "stop" comes after that lane's connections are closed
  local lines = srv:stdout_lines()
  for i, l in ipairs(lines) do
    local lane = l:match("^close %a+ lane (%d+)$")
    if lane then
      local stop = line_index(lines, "^stop lane " .. lane .. "$")
      assert.truthy(stop, "no stop handler output for lane " .. lane .. ":\n" .. srv:stdout())
      assert.is_true(stop > i, "stop handler ran before a connection closed:\n" .. srv:stdout())
    end
  end
  -- one stop handler per lane
  assert.equal(srv.threads, #srv:stdout_lines("^stop lane %d+$"), srv:stdout())
end

describe("graceful shutdown", function()
  after_each(H.cleanup)

  for _, case in ipairs { { "SIGTERM", H.SIGTERM }, { "SIGINT", H.SIGINT } } do
    it(case[1] .. " delivers on_shutdown bytes to every client, then EOF, and exits 0", function()
      local port = H.free_port()
      local srv = H.start("shutdown.lua", { args = { port }, wait_port = port, grace = 5 })
      local clients = {}
      for i = 1, 5 do
        clients[i] = H.connect(port)
        assert.equal("hi" .. i, H.roundtrip(clients[i], "hi" .. i))
      end
      local t0 = H.now()
      assert.equal(0, srv:stop(case[2], H.T(5)))
      assert.is_true(H.now() - t0 < H.T(4), "shutdown took the whole grace period")
      for i, c in ipairs(clients) do
        local data, how = H.read_to_eof(c, H.T(3))
        assert.equal("bye\n", data, ("client %d: %s"):format(i, tostring(how)))
      end
      assert.equal(5, #srv:stdout_lines("^close shutdown lane"), srv:stdout())
      check_order(srv)
      assert.is_false(H.is_listening(port))
    end)
  end

  -- alone, and in a worker of -w 2 (which asks its root: every worker
  -- stops, none is started again)
  for _, case in ipairs { { "", {} }, { " from a worker of -w 2", { "-w", 2 } } } do
    it("mp.stop()" .. case[1] .. " shuts down the whole server", function()
      local port = H.free_port()
      local srv = H.start("shutdown.lua", { args = { port }, wait_port = port, grace = 5, options = case[2] })
      local other = H.connect(port)
      assert.equal("x", H.roundtrip(other, "x"))
      local c = H.connect(port)
      H.send(c, "stop")
      assert.same({ 0, "exit" }, { srv:wait_exit(H.T(8)) }, srv:stderr())
      assert.equal("bye\n", (H.read_to_eof(other, H.T(3))))
      assert.falsy(H.plain(srv:stderr(), "starting a new one"), srv:stderr())
      assert.is_false(H.is_listening(port))
      if #case[2] == 0 then check_order(srv) end
    end)
  end

  it("cuts a connection that cannot drain at the grace deadline (-g 1), exit 0", function()
    local port = H.free_port()
    local srv = H.start("shutdown.lua", { args = { port }, wait_port = port, grace = 1 })
    -- holds: small receive buffer and never reads, so 16 MB cannot drain
    local stuck = H.connect(port, { rcvbuf = 16384 })
    assert.equal("hold", H.roundtrip(stuck, "hold"))
    local fine = H.connect(port)
    assert.equal("ok", H.roundtrip(fine, "ok"))

    local t0 = H.now()
    local st, how = srv:stop(H.SIGTERM, H.T(6))
    local took = H.now() - t0
    assert.equal(0, st, tostring(how))
    assert.is_true(took >= 0.8, ("exited after %.2fs, before the 1 s grace deadline"):format(took))
    -- cut by the worker at its deadline, not by the root's kill 2 s later
    -- (which says so); how long the exit then takes is the machine's
    assert.falsy(H.plain(srv:stderr(), "did not stop in time"), ("killed after %.2fs with -g 1: %s"):format(
      took, srv:stderr()))
    assert.truthy(srv:stdout():find("close shutdown", 1, true) or srv:stdout():find("close timeout", 1, true),
      srv:stdout())
    assert.equal("bye\n", (H.read_to_eof(fine, H.T(3))))
    -- the stuck client gets part of the 16 MB, then the connection is gone
    local data, err = H.read_to_eof(stuck, H.T(5))
    assert.truthy(data or err ~= "timeout", "stuck connection still open after exit")
    assert.is_true(#(data or "") < 16 * 1024 * 1024, "all 16 MB arrived despite the cut")
  end)
end)
