-- Spec: pub/sub. mp.subscribe, conn:subscribe and mp.publish in one process
-- (-t 1, -t 4) and across worker processes (-w 2, -w 4) in every scope,
-- from worker lanes and from the root lane; glob patterns, cancelling,
-- connections that close, tables, binary messages, ordering, limits, a
-- worker killed and replaced, errors in subscribers. Everything goes
-- through the real binary: the test clients trigger publishes with the
-- line protocol of spec/fixtures/pubsub_node.lua (its header describes it)
-- and observe deliveries on their connections (conn:subscribe) or on stdout
-- (start-up mp.subscribe in every lane, the root's included).
local H = require "spec.helper"
local ffi = require "ffi"     -- kill(2) is declared by spec/helper.lua

local FIXTURE = "pubsub_node.lua"

---------------------------------------------------------------------------
-- /proc helpers
---------------------------------------------------------------------------

local running, children, cmdline = H.running, H.children, H.cmdline

-- A counter of /proc/<pid>/io ("wchar": bytes the process passed to
-- write(2) and writev(2), which is how the root sends frames to workers),
-- or nil if unreadable.
local function proc_io(pid, field)
  local s = H.read_file("/proc/" .. pid .. "/io")
  return s and tonumber(s:match(field .. ":%s*(%d+)"))
end

local function sorted(t)
  table.sort(t)
  return t
end

local function count(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n
end

---------------------------------------------------------------------------
-- Bookkeeping so that no process outlives its test
---------------------------------------------------------------------------

local started, tracked = {}, {}

local function cleanup()
  for _, node in ipairs(started) do
    if node.srv:alive() then
      for _, p in ipairs(children(node.srv:pid())) do tracked[p] = true end
    end
  end
  local ok, err = pcall(H.cleanup)      -- SIGKILLs the roots still running
  for pid in pairs(tracked) do
    local cl = cmdline(pid)
    if running(pid) and cl and cl:find(FIXTURE, 1, true) then ffi.C.kill(pid, H.SIGKILL) end
  end
  started, tracked = {}, {}
  if not ok then error(err, 0) end
end

-- Quiet period: how long to wait for something that must not come.
local function Q() return H.T(0.2) end

---------------------------------------------------------------------------
-- Clients: replies are lines, deliveries are "D label kind clen mlen\n"
-- frames followed by the channel and the message.
---------------------------------------------------------------------------

local Client = require("spec.node_client")({})
Client.__index = Client

function Client:_parse()
  while true do
    local nl = self.buf:find("\n", 1, true)
    if not nl then return end
    local line = self.buf:sub(1, nl - 1)
    local label, kind, clen, mlen = line:match("^D (%S+) (%a) (%d+) (%d+)$")
    if label then
      clen, mlen = tonumber(clen), tonumber(mlen)
      local stop = nl + clen + mlen
      if #self.buf < stop then return end
      self.n = self.n + 1
      self.deliveries[#self.deliveries + 1] = {
        label = label, kind = kind, seq = self.n,
        ch = self.buf:sub(nl + 1, nl + clen), msg = self.buf:sub(nl + clen + 1, stop),
      }
      self.buf = self.buf:sub(stop + 1)
    else
      self.n = self.n + 1
      self.replies[#self.replies + 1] = line
      self.reply_seqs[#self.reply_seqs + 1] = self.n
      self.buf = self.buf:sub(nl + 1)
    end
  end
end

-- The next reply line, and its place among everything this client
-- received (replies and deliveries are numbered in arrival order).
function Client:reply(timeout)
  self:wait(function() return #self.replies > 0 end, timeout, "a reply")
  return table.remove(self.replies, 1), table.remove(self.reply_seqs, 1)
end

function Client:cmd(line, timeout)
  self:send(line .. "\n")
  return (self:reply(timeout))
end

-- Returns once the root has read every frame this client's process sent
-- it before (at once in a one-process server).
function Client:barrier() self:expect_reply("barrier", "synced") end

function Client:delivery(timeout)
  self:wait(function() return #self.deliveries > 0 end, timeout, "a delivery")
  return table.remove(self.deliveries, 1)
end

-- The next delivery is exactly this. Returns it.
function Client:expect(label, ch, msg, kind)
  local d = self:delivery()
  assert.same({ label = label, kind = kind or "s", ch = ch, msg = msg },
    { label = d.label, kind = d.kind, ch = d.ch, msg = d.msg }, self.name .. ": next delivery")
  return d
end

-- Nothing more is delivered for a quiet period.
function Client:assert_quiet(what)
  local deadline = H.now() + Q()
  while H.now() < deadline and not self.closed do self:_fill(deadline) end
  local extra = {}
  for _, d in ipairs(self.deliveries) do
    extra[#extra + 1] = ("%s %s %q"):format(d.label, d.ch, d.msg:sub(1, 60))
  end
  self.deliveries = {}
  assert.same({}, extra, self.name .. ": unexpected deliveries " .. (what or ""))
end

-- The server closed this connection (within timeout).
function Client:assert_closed(what)
  local _, err = H.read_to_eof(self.c, H.T(3))
  assert.is_true(err ~= "timeout", self.name .. ": still open " .. (what or ""))
end

---------------------------------------------------------------------------
-- Servers
---------------------------------------------------------------------------

local Node = {}
Node.__index = Node

-- For servers whose writes root_wrote measures: no io_uring batching.
local DIRECT_WRITES = { MOONPORT_IO_URING = "0" }

-- Starts the fixture: opts.workers (-w; nil: one process), opts.threads
-- (-t; nil: MOONPORT_TEST_THREADS or none), opts.subs (start-up
-- subscriptions "label:flags:channel" in every lane), opts.env (variables
-- for its environment). Waits until every
-- lane reported "ready" (its start-up subscriptions known to the root).
local function start(opts)
  opts = opts or {}
  local port = H.free_port()
  local args = { port }
  for _, s in ipairs(opts.subs or {}) do args[#args + 1] = s end
  local srv = H.start(FIXTURE, {
    args = args, wait_port = port, threads = opts.threads,
    options = opts.workers and { "-w", opts.workers } or nil, env = opts.env,
  })
  local node = setmetatable({ srv = srv, port = port, workers = opts.workers or 1,
    lanes = srv.threads }, Node)
  started[#started + 1] = node
  local want = node.workers * node.lanes + (node.workers > 1 and 1 or 0)
  H.wait_for(function()
    if not srv:alive() then error("server exited during start-up: " .. srv:describe(), 0) end
    if node.workers > 1 then
      for _, p in ipairs(children(srv:pid())) do tracked[p] = true end
    end
    return #srv:stdout_lines("^ready ") >= want
  end, H.T(10), function()
    return ("%d ready lines: %s"):format(want, srv:describe())
  end)
  return node
end

function Node:describe() return self.srv:describe() end

-- pid -> number of "ready" lines of worker processes (or of the one
-- process).
function Node:ready_workers()
  local t = {}
  for _, l in ipairs(self.srv:stdout_lines("^ready worker ")) do
    local pid = tonumber(l:match(" pid=(%d+) "))
    t[pid] = (t[pid] or 0) + 1
  end
  return t
end

-- Sorted "pid:lane" keys of every lane of the worker processes `pids`,
-- plus the root lane if `root`.
function Node:keys(pids, root)
  local t = {}
  if root then t[#t + 1] = self.srv:pid() .. ":1" end
  for _, pid in ipairs(pids) do
    for l = 1, self.lanes do t[#t + 1] = pid .. ":" .. l end
  end
  return sorted(t)
end

-- Pids of the workers that reported ready and still run (the one process
-- without -w).
function Node:worker_pids()
  local t = {}
  for pid in pairs(self:ready_workers()) do
    if running(pid) then t[#t + 1] = pid end
  end
  return sorted(t)
end

-- Sorted "pid:lane" keys of the stdout deliveries to start-up subscriber
-- `label` of message `msg` (one key per delivery).
function Node:S(label, msg)
  local t = {}
  for _, l in ipairs(self.srv:stdout_lines("^S ")) do
    local lb, pid, lane, m = l:match("^S (%S+) %a+ pid=(%d+) w=%d+ lane=(%d+) ch=%S* msg=(.*)$")
    if lb == label and m == msg then t[#t + 1] = pid .. ":" .. lane end
  end
  return sorted(t)
end

function Node:wait_S(label, msg, n)
  H.wait_for(function() return #self:S(label, msg) >= n end, H.T(5), function()
    return ("%d stdout deliveries of %q to %s (have %d): %s"):format(n, msg, label,
      #self:S(label, msg), self:describe())
  end)
  return self:S(label, msg)
end

function Node:count_lines(pat) return #self.srv:stdout_lines(pat) end

function Node:wait_lines(pat, n)
  H.wait_for(function() return self:count_lines(pat) >= n end, H.T(5), function()
    return ("%d stdout lines matching %q: %s"):format(n, pat, self:describe())
  end)
end

-- A connected client that knows where it is served.
function Node:client()
  local cl = setmetatable({ c = H.connect(self.port), buf = "", replies = {},
    reply_seqs = {}, deliveries = {}, n = 0, node = self, name = "client" }, Client)
  local who = cl:cmd("who")
  local pid, w, lane, id = who:match("^who pid=(%d+) w=(%d+) lane=(%d+) id=(%d+) ")
  assert.truthy(pid, "bad reply to who: " .. who)
  cl.pid, cl.w, cl.lane, cl.id = tonumber(pid), tonumber(w), tonumber(lane), id
  cl.name = ("client (worker %d pid %d lane %d conn %s)"):format(cl.w, cl.pid, cl.lane, id)
  return cl
end

-- Opens clients until done(by) where by maps key(client) -> list of
-- clients; raises after `max` clients.
function Node:clients_until(key, done, max, what)
  local by, n = {}, 0
  while not done(by) do
    if n >= (max or 200) then
      local dist = {}
      for k, l in pairs(by) do dist[#dist + 1] = ("%s: %d"):format(k, #l) end
      error(("%s: not after %d connections (%s)"):format(what or "clients", n,
        table.concat(dist, ", ")), 2)
    end
    local cl = self:client()
    n = n + 1
    local k = key(cl)
    by[k] = by[k] or {}
    table.insert(by[k], cl)
  end
  return by
end

-- One client on each of `k` different workers (default: all), in worker
-- order.
function Node:one_per_worker(k)
  k = k or self.workers
  local by = self:clients_until(function(c) return c.pid end,
    function(b) return count(b) >= k end, 200, ("clients on %d workers"):format(k))
  local list = {}
  for _, l in pairs(by) do list[#list + 1] = l[1] end
  table.sort(list, function(a, b) return a.w < b.w end)
  return list
end

-- A client served by process `pid`.
function Node:client_on(pid)
  return self:clients_until(function(c) return c.pid end,
    function(b) return b[pid] ~= nil end, 200, "a client on pid " .. pid)[pid][1]
end

-- SIGTERM; the server must exit 0.
function Node:stop()
  local st, how = self.srv:stop(H.SIGTERM, H.T(10))
  assert.equal(0, st, tostring(how) .. ": " .. self:describe())
end

-- No pub/sub trouble and no callback error was logged.
function Node:assert_clean_stderr()
  for _, l in ipairs(H.lines(self.srv:stderr())) do
    assert.is_nil(l:find("pub/sub", 1, true), "stderr: " .. l)
    assert.is_nil(l:find("error in ", 1, true), "stderr: " .. l)
  end
end

-- Bytes the root wrote (to its workers) while fn ran, or nil if
-- /proc/<root>/io cannot be read. wchar counts write(2)s only, not the
-- sends the reactor batches through io_uring: servers measured this way
-- start with DIRECT_WRITES in their environment.
function Node:root_wrote(fn)
  local before = proc_io(self.srv:pid(), "wchar")
  fn()
  local after = proc_io(self.srv:pid(), "wchar")
  return before and after and after - before
end

-- The canonical text (pubsub_node.lua's canon()) of the table that
-- "pubtable" publishes, once it went through JSON.
local TABLE_TEXT = '{"empty"="","list"={1=1,2="two",3={"three"=3}},"n"=42,"name"="moon",'
  .. '"nested"={"deep"={"deeper"={"s"="line\\010break \\034q\\034 \\092 tab\\009"}}},'
  .. '"no"=false,"ok"=true,"pi"=3.5}'

-- Every byte value in order, repeated (the fixture's gen(n)).
local function gen(n)
  local b = {}
  for i = 0, 255 do b[#b + 1] = string.char(i) end
  return table.concat(b):rep(math.ceil(n / 256)):sub(1, n)
end

-- Two configurations: one process, and two workers with the subscriber and
-- the publisher in different workers. `threads` forces -t for the one
-- process (where lanes matter).
local function configs(threads)
  return {
    { name = "one process", workers = nil, threads = threads },
    { name = "-w 2, across workers", workers = 2 },
  }
end

-- Subscriber client(s) and a publisher client for a configuration: in
-- different workers with -w.
local function sub_and_pub(node, nsubs)
  nsubs = nsubs or 1
  local subs, pub = {}
  if node.workers > 1 then
    local list = node:one_per_worker(2)
    pub = list[2]
    subs[1] = list[1]
    for i = 2, nsubs do subs[i] = node:client_on(list[1].pid) end
  else
    for i = 1, nsubs do subs[i] = node:client() end
    pub = node:client()
  end
  return subs, pub
end

---------------------------------------------------------------------------

describe("pub/sub", function()
  after_each(cleanup)

  describe("in one process", function()
    for _, t in ipairs { 1, 4 } do
      it(("-t %d: every lane's subscribers get what any lane publishes; cluster, process and root reach them all, siblings none"):format(t), function()
        local node = start { threads = t, subs = { "L:-:room", "G:g:r?o*" } }
        local pid = node.srv:pid()
        local all = node:keys({ pid })
        assert.equal(t, #all)

        -- clients on as many lanes as the kernel gives us: every lane, or
        -- at least two after 120 connections
        local by, opened = {}, 0
        while count(by) < t and opened < 120 do
          local c = node:client()
          opened = opened + 1
          by[c.lane] = by[c.lane] or c
        end
        local subs = {}
        for lane = 1, t do
          if by[lane] then
            by[lane]:sub("a", "-", "room")
            subs[#subs + 1] = by[lane]
          end
        end
        assert.is_true(#subs >= math.min(t, 2), ("clients reached %d lane(s) of %d"):format(#subs, t))

        local function delivered_everywhere(msg)
          for _, c in ipairs(subs) do c:expect("a", "room", msg) end
          assert.same(all, node:wait_S("L", msg, t), "mp.subscribe in every lane: " .. msg)
          assert.same(all, node:wait_S("G", msg, t), "glob mp.subscribe in every lane: " .. msg)
        end

        -- every lane publishes in turn
        for i, p in ipairs(subs) do
          p:pub("-", "room", "from-lane-" .. p.lane)
          delivered_everywhere("from-lane-" .. p.lane)
          if i > 2 then break end
        end
        local p = subs[#subs]
        for _, scope in ipairs { "cluster", "process", "root", "{}" } do
          p:pub(scope, "room", "to-" .. scope)
          delivered_everywhere("to-" .. scope)
        end
        -- siblings: nobody (one process has no siblings); the next message
        -- on the channel from the same publisher is the next delivery
        p:pub("siblings", "room", "to-siblings")
        p:pub("process", "room", "after-siblings")
        delivered_everywhere("after-siblings")
        assert.same({}, node:S("L", "to-siblings"))
        assert.same({}, node:S("G", "to-siblings"))
        for _, c in ipairs(subs) do c:assert_quiet() end
        node:assert_clean_stderr()
        node:stop()
      end)
    end
  end)

  for _, W in ipairs { 2, 4 } do
    describe(("-w %d"):format(W), function()
      it("from a worker: cluster reaches every worker and the root, process the publisher only, siblings the other workers, root the root lane", function()
        local node = start { workers = W, subs = { "L:-:sc" } }
        local pids = node:worker_pids()
        assert.equal(W, #pids, node:describe())
        local P = node:client()
        local others = {}
        for _, pid in ipairs(pids) do if pid ~= P.pid then others[#others + 1] = pid end end
        local all = node:keys(pids, true)
        local cases = {
          { "cluster", all }, { "-", all }, { "{}", all },
          { "process", node:keys({ P.pid }) },
          { "siblings", node:keys(others) },
          { "root", { node.srv:pid() .. ":1" } },
        }
        for _, case in ipairs(cases) do P:pub(case[1], "sc", "w-" .. case[1]) end
        P:pub("cluster", "sc", "w-fence")
        -- everything the publisher sent before the fence was delivered
        -- before it (one publisher, one channel); wait a little more for
        -- deliveries that should not happen at all
        node:wait_S("L", "w-fence", #all)
        H.sleep(Q())
        for _, case in ipairs(cases) do
          assert.same(case[2], node:S("L", "w-" .. case[1]),
            ("scope %s from worker %d (pid %d): receivers (pid:lane)"):format(case[1], P.w, P.pid))
        end
        node:assert_clean_stderr()
        node:stop()
      end)

      it("from the root lane (a timer): cluster reaches the root and every worker, siblings every worker, process and root the root lane only", function()
        local node = start { workers = W, subs = { "L:-:sc" } }
        local pids = node:worker_pids()
        assert.equal(W, #pids, node:describe())
        local root = { node.srv:pid() .. ":1" }
        local all = node:keys(pids, true)
        local cases = {
          { "cluster", all }, { "-", all }, { "{}", all },
          { "siblings", node:keys(pids) },
          { "process", root }, { "root", root },
        }
        local P = node:client()
        for i, case in ipairs(cases) do
          -- one at a time: the root lane's timers then publish in order
          P:pub("root", "ctl.root", case[1] .. " sc r-" .. case[1])
          node:wait_lines("^rootpub ok$", i)
        end
        P:pub("root", "ctl.root", "cluster sc r-fence")
        node:wait_lines("^rootpub ok$", #cases + 1)
        node:wait_S("L", "r-fence", #all)
        H.sleep(Q())
        for _, case in ipairs(cases) do
          assert.same(case[2], node:S("L", "r-" .. case[1]),
            ("scope %s from the root lane: receivers (pid:lane)"):format(case[1]))
        end
        assert.equal(0, node:count_lines("^rootpub err"), node:describe())
        node:assert_clean_stderr()
        node:stop()
      end)
    end)
  end

  for _, cfg in ipairs(configs()) do
    describe(cfg.name, function()
      it("glob patterns with { match = \"glob\" }; channels with * and ? are exact without it", function()
        local node = start(cfg)
        local subs, P = sub_and_pub(node)
        local S = subs[1]
        S:sub("g1", "g", "chat.*")
        S:sub("g2", "g", "user.?")
        S:sub("g3", "g", "[abc]*")
        S:sub("g4", "g", "x\\*y")
        S:sub("g5", "g", "[^abc]oo")
        S:sub("e1", "-", "chat.*")
        S:sub("e2", "x", "user.?")
        assert.matches("^err sub b ", S:cmd("sub b B chat.*"))
        assert.equal("channel g1 chat.*", S:cmd("channel g1"))
        assert.equal("channel g4 x\\*y", S:cmd("channel g4"))
        assert.equal("channel e2 user.?", S:cmd("channel e2"))
        S:barrier()
        local cases = {
          { "chat.lobby", { "g1", "g3" } },
          { "chat.", { "g1", "g3" } },
          { "chat", { "g3" } },
          { "chat.*", { "e1", "g1", "g3" } },
          { "Chat.lobby", {} },
          { "user.1", { "g2" } },
          { "user.12", {} },
          { "user.", {} },
          { "user.?", { "e2", "g2" } },
          { "apple", { "g3" } },
          { "banana", { "g3" } },
          { "dog", {} },
          { "zoo", { "g5" } },
          { "boo", { "g3" } },
          { "x*y", { "g4" } },
          { "xzy", {} },
          { "x\\*y", {} },
        }
        local n, want = 0, {}
        for _, case in ipairs(cases) do
          P:pub("-", case[1], case[1])
          n = n + #case[2]
          want[case[1]] = sorted(case[2])
        end
        local got = {}
        for _, case in ipairs(cases) do got[case[1]] = {} end
        for _, d in ipairs(S:collect(n)) do
          assert.equal(d.ch, d.msg)
          table.insert(got[d.ch], d.label)
        end
        S:assert_quiet()
        for k, v in pairs(got) do got[k] = sorted(v) end
        assert.same(want, got)
        node:assert_clean_stderr()
        node:stop()
      end)

      it("s:cancel() stops delivery and s:active() turns false; a callback may cancel itself", function()
        local node = start(cfg)
        local subs, P = sub_and_pub(node)
        local S = subs[1]
        S:sub("a", "-", "news")
        S:sub("m", "m", "news")       -- mp.subscribe
        S:sub("o", "1", "news")       -- cancels itself in its first call
        S:sub("f", "g", "new*")       -- a pattern: the fence below
        S:barrier()
        assert.equal("active a true", S:cmd("active a"))
        assert.equal("active m true", S:cmd("active m"))
        assert.equal("channel a news", S:cmd("channel a"))
        assert.equal("channel f new*", S:cmd("channel f"))

        P:pub("-", "news", "one")
        local labels = {}
        for _, d in ipairs(S:collect(4)) do
          assert.same({ "news", "one" }, { d.ch, d.msg })
          labels[#labels + 1] = d.label
        end
        assert.same({ "a", "f", "m", "o" }, sorted(labels))
        assert.equal("active o false", S:cmd("active o"))

        assert.equal("ok cancel a active=false", S:cmd("cancel a"))
        assert.equal("ok cancel a active=false", S:cmd("cancel a"))   -- again: harmless
        assert.equal("ok cancel m active=false", S:cmd("cancel m"))
        assert.equal("active a false", S:cmd("active a"))
        assert.equal("channel a news", S:cmd("channel a"))
        S:barrier()
        -- exact subscribers are called before patterns: once the pattern
        -- has "two", a cancelled one would have had it already
        P:pub("-", "news", "two")
        S:expect("f", "news", "two")

        -- the last one goes too; then nobody gets "three"; a new
        -- subscription gets what comes after it. "three" crosses the root
        -- to this worker on its own time: a message on a fence channel
        -- from the same publisher, behind it, says it has been handled
        -- here before b subscribes (else b could get it, rightly).
        S:sub("g", "-", "fence")
        assert.equal("ok cancel f active=false", S:cmd("cancel f"))
        S:barrier()
        P:pub("-", "news", "three")
        P:pub("-", "fence", "after three")
        S:expect("g", "fence", "after three")
        S:sub("b", "-", "news")
        S:barrier()
        P:pub("-", "news", "four")
        S:expect("b", "news", "four")
        S:assert_quiet()
        node:assert_clean_stderr()
        node:stop()
      end)
    end)
  end

  for _, cfg in ipairs(configs(1)) do
    it(cfg.name .. ": conn:subscribe is cancelled when its connection closes; the server stays healthy", function()
      local node = start(setmetatable({ env = DIRECT_WRITES }, { __index = cfg }))
      local subs, P = sub_and_pub(node, 3)
      local A1, A2, A3 = subs[1], subs[2], subs[3]
      A1:sub("a", "-", "room")
      A1:sub("ag", "g", "ro*")
      A2:sub("a2", "-", "room")
      A3:sub("a3", "-", "room")
      for _, c in ipairs(subs) do c:barrier() end
      P:sub("p", "-", "room")
      P:sub("pc", "-", "crowd")
      -- many connections with subscriptions that go away abruptly
      local many = {}
      for i = 1, 20 do
        local c = node:client()
        c:sub("x", "-", "crowd")
        c:sub("y", "g", "cr*")
        c:sub("z", "-", "other" .. i)
        c:barrier()
        many[i] = c
      end
      P:pub("-", "crowd", "c1")
      P:expect("pc", "crowd", "c1")
      for _, c in ipairs(many) do
        local got = c:collect(2)
        assert.same({ "x c1", "y c1" }, sorted { got[1].label .. " " .. got[1].msg, got[2].label .. " " .. got[2].msg })
      end

      local control
      if node.workers > 1 then
        -- the root forwards a big message to the subscribers' worker
        control = node:root_wrote(function()
          assert.equal("ok pub", P:cmd("pubbig - room 2000000", H.T(10)))
          for _, c in ipairs(subs) do
            local d = c:delivery(H.T(10))
            assert.equal(2000000, #d.msg)
          end
          A1:delivery(H.T(10))
          P:delivery(H.T(10))
        end)
      end
      P:pub("-", "room", "one")
      A1:expect("a", "room", "one")
      A1:expect("ag", "room", "one")
      A2:expect("a2", "room", "one")
      A3:expect("a3", "room", "one")
      P:expect("p", "room", "one")

      -- the client closes A1; A3 is closed by the server (conn:close())
      A1.c:close()
      A3:send("close\n")
      A3:assert_closed()
      for _, c in ipairs(many) do c.c:close() end
      node:wait_lines("^close id=" .. A1.id .. " reason=peer ", 1)
      node:wait_lines("^close id=" .. A3.id .. " reason=local ", 1)
      node:wait_lines("^close id=%d+ reason=peer ", 21)

      P:pub("-", "room", "two")
      A2:expect("a2", "room", "two")
      P:expect("p", "room", "two")
      P:pub("-", "crowd", "c2")
      P:expect("pc", "crowd", "c2")

      A2.c:close()
      node:wait_lines("^close id=" .. A2.id .. " reason=peer ", 1)
      P:pub("-", "room", "three")
      P:expect("p", "room", "three")
      H.sleep(Q())
      assert.same({}, node.srv:stdout_lines("^LATE "), node:describe())

      if node.workers > 1 then
        -- nobody on the other worker subscribes any more: the root sends
        -- it nothing (the closes told it)
        local wrote = node:root_wrote(function()
          assert.equal("ok pub", P:cmd("pubbig - room 2000000", H.T(10)))
          P:delivery(H.T(10))
          P:barrier()
          H.sleep(0.1)
        end)
        if control and wrote then
          assert.is_true(control >= 2000000, "control: the root wrote only " .. control .. " bytes")
          assert.is_true(wrote < 100000, ("the root wrote %d bytes for a channel nobody on another worker subscribes"):format(wrote))
        end
      end

      -- healthy: new connections, subscriptions and publishes work
      local N = node:client()
      N:sub("n", "-", "room")
      N:barrier()
      P:pub("-", "room", "four")
      N:expect("n", "room", "four")
      P:expect("p", "room", "four")
      assert.same({}, node.srv:stdout_lines("^LATE "), node:describe())
      node:assert_clean_stderr()
      node:stop()
    end)
  end

  it("-w 2: tables arrive as tables (nested), in the publisher's worker, the others and the root; strings stay strings", function()
    local node = start { workers = 2, subs = { "T:-:tbl" } }
    local list = node:one_per_worker(2)
    local A, B = list[1], list[2]
    A:sub("t", "-", "tbl")
    B:sub("t", "-", "tbl")
    A:barrier()
    B:barrier()
    assert.equal("ok pub", B:cmd("pubtable - tbl"))
    A:expect("t", "tbl", TABLE_TEXT, "t")
    B:expect("t", "tbl", TABLE_TEXT, "t")
    local all = node:keys(node:worker_pids(), true)
    assert.same(all, node:wait_S("T", TABLE_TEXT, #all))
    -- a string that looks like JSON is a string
    B:pub("-", "tbl", '{"a":1}')
    A:expect("t", "tbl", '{"a":1}', "s")
    B:expect("t", "tbl", '{"a":1}', "s")
    assert.same(all, node:wait_S("T", '{"a":1}', #all))
    node:assert_clean_stderr()
    node:stop()
  end)

  it("-w 2: strings are binary-safe: every byte value, an empty message, a binary channel, 1 MiB", function()
    local node = start { workers = 2 }
    local list = node:one_per_worker(2)
    local A, B = list[1], list[2]
    local bin_ch = "b\0n\255 \r"
    for _, c in ipairs { A, B } do
      c:sub("b", "-", "bin")
      c:sub("z", "-", bin_ch)
      c:barrier()
    end
    local bytes = gen(512) .. "\r\n\0D x s 1 1\n"
    B:pubraw("-", "bin", bytes)
    A:expect("b", "bin", bytes)
    B:expect("b", "bin", bytes)
    B:pubraw("-", "bin", "")
    A:expect("b", "bin", "")
    B:expect("b", "bin", "")
    B:pubraw("-", bin_ch, "\0")
    A:expect("z", bin_ch, "\0")
    B:expect("z", bin_ch, "\0")

    math.randomseed(12345)
    local parts = {}
    for i = 1, 1024 do
      local chunk = {}
      for j = 1, 1024 do chunk[j] = math.random(0, 255) end
      parts[i] = string.char(unpack(chunk))
    end
    local big = table.concat(parts)
    assert.equal(1048576, #big)
    B:pubraw("-", "bin", big)
    for _, c in ipairs { A, B } do
      local d = c:delivery(H.T(10))
      assert.same({ "b", "s", "bin", 1048576 }, { d.label, d.kind, d.ch, #d.msg })
      assert.is_true(d.msg == big, c.name .. ": the 1 MiB message arrived altered")
    end
    A:assert_quiet()
    node:assert_clean_stderr()
    node:stop()
  end)

  it("-w 2: 1,000 numbered messages from one publisher arrive in order in another worker (and in its own)", function()
    local node = start { workers = 2 }
    local list = node:one_per_worker(2)
    local A, B = list[1], list[2]
    A:sub("o", "-", "seq")
    B:sub("o", "-", "seq")
    A:barrier()
    B:barrier()
    assert.equal("ok pubseq 1000", B:cmd("pubseq - seq 1000", H.T(10)))
    for _, c in ipairs { A, B } do
      local got = c:collect(1000, H.T(15))
      for i, d in ipairs(got) do
        if d.msg ~= tostring(i) then
          error(("%s: delivery %d is %q (channel %q)"):format(c.name, i, d.msg, d.ch), 0)
        end
      end
      c:assert_quiet()
    end
    node:assert_clean_stderr()
    node:stop()
  end)

  it("-w 2: a channel with no subscribers goes nowhere; a later subscriber gets only later messages", function()
    local node = start { workers = 2, subs = { "L:-:elsewhere" } }
    local list = node:one_per_worker(2)
    local A, B = list[1], list[2]
    for _, scope in ipairs { "-", "cluster", "process", "siblings", "root" } do
      B:pub(scope, "void", "old-" .. scope)
    end
    B:pub("root", "ctl.root", "cluster void old-from-root")
    node:wait_lines("^rootpub ok$", 1)
    A:sub("v", "-", "void")
    B:sub("v", "-", "void")
    A:barrier()
    B:barrier()
    B:pub("-", "void", "new")
    A:expect("v", "void", "new")
    B:expect("v", "void", "new")
    A:assert_quiet()
    B:assert_quiet()
    assert.same({}, node.srv:stdout_lines("^S "))
    assert.equal(0, node:count_lines("^publish error"))
    node:assert_clean_stderr()
    node:stop()
  end)

  for _, cfg in ipairs(configs()) do
    it(cfg.name .. ": a message over 8 MiB or a channel over 4 KiB makes mp.publish raise; at the limits they go through", function()
      local node = start(cfg)
      local subs, P = sub_and_pub(node)
      local S = subs[1]
      local long = ("c"):rep(4096)
      S:sub("big", "s", "big")
      S:sub("long", "-", long)
      S:barrier()
      local errors = 0
      local function refused(line)
        local r = P:cmd(line, H.T(10))
        assert.matches("^err pub ", r, line:sub(1, 60))
        errors = errors + 1
        node:wait_lines("^publish error: ", errors)
        return r
      end
      refused("pubbig - big 8388609")
      refused("pubbig cluster big 16777216")
      refused("pubbig process big 8388609")
      refused("publong - 4097 x")
      refused("publong siblings 4097 x")
      refused("pubbigtable - big 8388605")   -- 8 MiB + 1 of JSON
      assert.equal("ok pub", P:cmd("pubbig - big 8388608", H.T(20)))
      S:expect("big", "big", "len=8388608 gen=true")
      assert.equal("ok pub", P:cmd("publong - 4096 x"))
      S:expect("long", long, "x")
      P:pub("-", "big", "after")
      S:expect("big", "big", "len=5 gen=false")
      S:assert_quiet()
      assert.equal(errors, node:count_lines("^publish error: "))
      node:assert_clean_stderr()
      node:stop()
    end)
  end

  it("-w 2: a worker killed with kill -9 is replaced; the root routes to the new one and forgets the old one's subscriptions", function()
    local node = start { workers = 2, subs = { "L:-:lane.ch" }, env = DIRECT_WRITES }
    local root = node.srv:pid()
    local list = node:one_per_worker(2)
    local X, Y = list[1], list[2]
    X:sub("d", "s", "only.dead")
    X:sub("dg", "gs", "only.d*")
    X:sub("s", "-", "shared")
    X:barrier()
    Y:sub("s", "-", "shared")
    Y:barrier()
    Y:pub("-", "shared", "one")
    X:expect("s", "shared", "one")
    Y:expect("s", "shared", "one")
    -- control: the root forwards a big message to X
    local control = node:root_wrote(function()
      assert.equal("ok pub", Y:cmd("pubbig - only.dead 2000000", H.T(10)))
      local got = {}
      for _, d in ipairs(X:collect(2, H.T(10))) do got[#got + 1] = d.label .. " " .. d.msg end
      assert.same({ "d len=2000000 gen=true", "dg len=2000000 gen=true" }, sorted(got))
    end)

    assert.equal(0, ffi.C.kill(X.pid, H.SIGKILL))
    X:assert_closed("after its worker was killed")
    local newpid
    H.wait_for(function()
      local kids = children(root)
      for _, p in ipairs(kids) do tracked[p] = true end
      if #kids ~= 2 then return false end
      for _, p in ipairs(kids) do
        if p ~= Y.pid and p ~= X.pid then newpid = p end
      end
      return newpid ~= nil and (kids[1] == Y.pid or kids[2] == Y.pid)
    end, H.T(3), function() return "a replacement worker: " .. node:describe() end, 0.02)
    H.wait_for(function() return (node:ready_workers()[newpid] or 0) >= node.lanes end,
      H.T(5), function() return "the new worker's lanes ready: " .. node:describe() end)
    node.srv:wait_stderr("(pid " .. X.pid .. ")", H.T(3), true)

    -- nobody subscribes only.dead now: the root sends nothing to anyone
    local wrote = node:root_wrote(function()
      assert.equal("ok pub", Y:cmd("pubbig - only.dead 2000000", H.T(10)))
      Y:barrier()
      H.sleep(0.1)
    end)

    -- the new worker's start-up subscriptions work
    local all = node:keys({ Y.pid, newpid }, true)
    Y:pub("-", "lane.ch", "after-kill")
    assert.same(all, node:wait_S("L", "after-kill", #all))

    -- a client of the new worker: messages both ways
    local N = node:client_on(newpid)
    N:sub("s", "-", "shared")
    N:sub("d", "s", "only.dead")
    N:barrier()
    Y:pub("-", "shared", "two")
    N:expect("s", "shared", "two")
    Y:expect("s", "shared", "two")
    N:pub("-", "shared", "three")
    Y:expect("s", "shared", "three")
    N:expect("s", "shared", "three")
    assert.equal("ok pub", Y:cmd("pubbig - only.dead 1000"))
    N:expect("d", "only.dead", "len=1000 gen=true")
    -- once its only subscriber cancels, the root stops sending it there
    -- (it would not if the dead worker's count had been carried over)
    assert.equal("ok cancel d active=false", N:cmd("cancel d"))
    N:barrier()
    local wrote2 = node:root_wrote(function()
      assert.equal("ok pub", Y:cmd("pubbig - only.dead 2000000", H.T(10)))
      Y:barrier()
      H.sleep(0.1)
    end)
    N:assert_quiet()
    if control then
      assert.is_true(control >= 2000000, "control: the root wrote only " .. control .. " bytes")
      assert.is_true(wrote < 100000, ("the root wrote %d bytes for a channel only the dead worker subscribed"):format(wrote))
      assert.is_true(wrote2 < 100000, ("the root wrote %d bytes for a channel nobody subscribes any more"):format(wrote2))
    end

    assert.is_true(node.srv:alive())
    assert.is_true(running(Y.pid) and running(newpid))
    node:assert_clean_stderr()
    node:stop()
  end)

  it("-t 1: a conn:subscribe callback is one of the connection's callbacks: it waits while another one sleeps, and never runs two at once", function()
    local node = start { threads = 1 }
    local C, P = node:client(), node:client()
    C:sub("a", "-", "room")
    C:sub("w", "W", "room2")     -- sleeps 100 ms in each call
    -- on_data sleeps 300 ms; a message arrives meanwhile
    C:send("nap " .. math.floor(H.T(0.3) * 1000) .. "\n")
    H.sleep(H.T(0.05))
    P:pub("-", "room", "during-nap")
    local r, rseq = C:reply(H.T(5))
    assert.equal("napped", r)
    local d = C:delivery()
    -- two messages for a subscriber that sleeps: one call after the other
    P:pub("-", "room2", "y1")
    P:pub("-", "room2", "y2")
    local ys = C:collect(2)
    H.sleep(Q())
    assert.same({}, node.srv:stdout_lines("^OVERLAP "),
      "subscriber callbacks ran while another callback of their connection waited")
    assert.same({ "a", "room", "during-nap" }, { d.label, d.ch, d.msg })
    assert.is_true(d.seq > rseq, "the delivery came before the reply of the callback that slept")
    assert.same({ "w y1", "w y2" }, { ys[1].label .. " " .. ys[1].msg, ys[2].label .. " " .. ys[2].msg },
      "a sleeping subscriber's messages, in order")
    node:assert_clean_stderr()
    node:stop()
  end)

  for _, cfg in ipairs(configs(1)) do
    describe(cfg.name .. ": errors in subscribers", function()
      it("an error in a conn:subscribe callback closes that connection only (reason \"error\")", function()
        local node = start(cfg)
        local subs, P = sub_and_pub(node, 2)
        local E, F = subs[1], subs[2]
        E:sub("e", "E", "room")
        F:sub("f", "-", "room")
        F:sub("fm", "m", "room")
        E:barrier()
        F:barrier()
        P:pub("-", "room", "hello")
        E:expect("e", "room", "hello")
        F:expect("f", "room", "hello")
        F:expect("fm", "room", "hello")
        P:pub("-", "room", "boom")
        E:assert_closed("after its subscriber raised")
        F:expect("f", "room", "boom")
        F:expect("fm", "room", "boom")
        node:wait_lines("^close id=" .. E.id .. " reason=error ", 1)
        node.srv:wait_stderr("subscriber failure e", H.T(3), true)
        local line = H.fixture_line(FIXTURE, 'error("subscriber failure "')
        assert.truthy(node.srv:stderr():find(FIXTURE .. ":" .. line, 1, true),
          "no file:line in the log: " .. node.srv:stderr())
        P:pub("-", "room", "after")
        F:expect("f", "room", "after")
        F:expect("fm", "room", "after")
        F:assert_quiet()
        assert.same({}, node.srv:stdout_lines("^LATE "), node:describe())
        assert.equal(1, node:count_lines("^close "), node:describe())
        local N = node:client()
        assert.matches("^who ", N:cmd("who"))
        node:stop()
      end)

      it("an error in an mp.subscribe callback is logged; the next message is still delivered", function()
        local node = start(cfg)
        local subs, P = sub_and_pub(node)
        local M = subs[1]
        M:sub("m", "mE", "room")
        M:sub("n", "m", "room")
        M:barrier()
        P:pub("-", "room", "boom")
        M:expect("n", "room", "boom")
        node.srv:wait_stderr("subscriber failure m", H.T(3), true)
        local line = H.fixture_line(FIXTURE, 'error("subscriber failure "')
        assert.truthy(node.srv:stderr():find(FIXTURE .. ":" .. line, 1, true),
          "no file:line in the log: " .. node.srv:stderr())
        P:pub("-", "room", "next")
        M:expect("m", "room", "next")
        M:expect("n", "room", "next")
        assert.equal("active m true", M:cmd("active m"))
        M:assert_quiet()
        assert.equal(0, node:count_lines("^close "), node:describe())
        node:stop()
      end)
    end)
  end
end)
