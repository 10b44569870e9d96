-- Spec: Redis. Pub/sub across moonport servers through a real
-- redis-server (--redis URL): exact and pattern subscribers on two servers,
-- once per subscription, tables, scopes that stay local, SUBSCRIBE and
-- UNSUBSCRIBE as the first and the last subscriber come and go (a worker
-- killed too), Redis restarted under running servers, a refused password,
-- bad URLs; and mp.redis, the command client.
--
-- Redis: the spec uses the redis-server on 127.0.0.1:$MOONPORT_TEST_REDIS_PORT
-- when that is set (.ci/run starts one) and otherwise starts its own for
-- the whole file (on a free port, no persistence). The restart and password
-- tests start private instances ($MOONPORT_TEST_REDIS_SERVER or the
-- redis-server on PATH), killed after each test. The spec talks to Redis
-- itself with a small RESP client over lua-socket (PUBSUB NUMSUB, CLIENT
-- LIST, PUBLISH, SUBSCRIBE). Channel and key names carry a per-test prefix,
-- so a shared Redis can't mix tests up.
--
-- The servers run spec/fixtures/pubsub_node.lua (its header describes the
-- line protocol the test clients speak) and spec/fixtures/redis_client.lua.
local H = require "spec.helper"
local ffi = require "ffi"     -- fork/exec/kill are declared by spec/helper.lua
local socket = require "socket"
local lfs = require "lfs"

local C = ffi.C
local FIXTURE = "pubsub_node.lua"
local CLIENT_FIXTURE = "redis_client.lua"

local function Q() return H.T(0.3) end    -- quiet period: for what must not come

local function sorted(t) table.sort(t) return t end
local function count(t) local n = 0 for _ in pairs(t) do n = n + 1 end return n end

-- Percent-encodes a redis_client.lua argument.
local function enc(s)
  return (tostring(s):gsub("[^%w%.%-_:*]", function(c) return ("%%%02X"):format(c:byte()) end))
end

-- A prefix for this test's channels and keys.
local ntok = 0
local function token()
  ntok = ntok + 1
  return ("rs%d.%d.%d"):format(C.getpid(), os.time() % 100000, ntok)
end

---------------------------------------------------------------------------
-- A RESP client (lua-socket), enough to inspect and drive Redis
---------------------------------------------------------------------------

local NIL = {}   -- a nil inside a reply being parsed

local function parse(buf, pos)
  local nl = buf:find("\r\n", pos, true)
  if not nl then return nil end
  local t, rest, nxt = buf:sub(pos, pos), buf:sub(pos + 1, nl - 1), nl + 2
  if t == "+" then return rest, nxt
  elseif t == "-" then return { err = rest }, nxt
  elseif t == ":" then return tonumber(rest), nxt
  elseif t == "$" then
    local n = tonumber(rest)
    if n < 0 then return NIL, nxt end
    if #buf < nxt + n + 1 then return nil end
    return buf:sub(nxt, nxt + n - 1), nxt + n + 2
  elseif t == "*" then
    local n = tonumber(rest)
    if n < 0 then return NIL, nxt end
    local a, p = { n = n }, nxt
    for i = 1, n do
      local v
      v, p = parse(buf, p)
      if v == nil then return nil end
      if v ~= NIL then a[i] = v end
    end
    return a, p
  end
  error("bad RESP from Redis: " .. ("%q"):format(buf:sub(pos, pos + 60)))
end

local function resp(args)
  local t = { "*" .. #args .. "\r\n" }
  for _, a in ipairs(args) do
    a = tostring(a)
    t[#t + 1] = "$" .. #a .. "\r\n" .. a .. "\r\n"
  end
  return table.concat(t)
end

local Resp = {}
Resp.__index = Resp

-- A connection to Redis on 127.0.0.1:port (AUTH first with a password), or
-- nil, err.
function Resp.connect(port, password)
  local c = socket.tcp()
  c:settimeout(H.T(5))
  local ok, err = c:connect("127.0.0.1", port)
  if not ok then c:close() return nil, err end
  c:setoption("tcp-nodelay", true)
  local r = setmetatable({ c = c, port = port, buf = "", pos = 1 }, Resp)
  if password then
    local v = r:call("AUTH", password)
    if v ~= "OK" then r:close() return nil, "AUTH: " .. tostring(v and v.err) end
  end
  return r
end

function Resp:close() pcall(self.c.close, self.c) end

function Resp:send(...)
  local ok, err = H.send(self.c, resp { ... }, H.T(10))
  if not ok then error(("redis %d: send: %s"):format(self.port, err), 2) end
end

-- Sends many commands in one write (each a list of arguments).
function Resp:send_many(cmds)
  local parts = {}
  for i, a in ipairs(cmds) do parts[i] = resp(a) end
  local ok, err = H.send(self.c, table.concat(parts), H.T(20))
  if not ok then error(("redis %d: send: %s"):format(self.port, err), 2) end
end

-- The next reply within timeout (nil for a nil reply); raises on timeout
-- or a closed connection, unless `soft`: then returns nil, "timeout".
function Resp:read(timeout, soft)
  local deadline = H.now() + (timeout or H.T(5))
  while true do
    local v, nxt = parse(self.buf, self.pos)
    if v ~= nil then
      self.pos = nxt
      if self.pos > 65536 then
        self.buf, self.pos = self.buf:sub(self.pos), 1
      end
      if v == NIL then return nil end
      return v
    end
    local data, err = H.read_some(self.c, deadline - H.now())
    if not data then
      if soft and err == "timeout" then return nil, "timeout" end
      error(("redis %d: %s while reading a reply"):format(self.port, err), 2)
    end
    self.buf = self.buf .. data
  end
end

function Resp:call(...)
  self:send(...)
  return self:read()
end

-- Subscriber connections: the next "message"/"pmessage" as
-- { kind, ch, msg [, pattern] }, or nil after timeout.
function Resp:message(timeout)
  local deadline = H.now() + (timeout or H.T(5))
  while true do
    local v, err = self:read(math.max(0, deadline - H.now()), true)
    if v == nil and err == "timeout" then return nil end
    if type(v) == "table" and v[1] == "message" then
      return { kind = "message", ch = v[2], msg = v[3] }
    elseif type(v) == "table" and v[1] == "pmessage" then
      return { kind = "pmessage", pattern = v[2], ch = v[3], msg = v[4] }
    end
    -- subscribe confirmations
  end
end

-- Every message that arrives until `done(list)` is true; raises after
-- timeout (with what came).
function Resp:messages_until(done, timeout, what)
  local list = {}
  local deadline = H.now() + (timeout or H.T(5))
  while not done(list) do
    local m = self:message(math.max(0, deadline - H.now()))
    if m then
      list[#list + 1] = m
    elseif H.now() >= deadline then
      local got = {}
      for i = math.max(1, #list - 10), #list do got[#got + 1] = ("%q"):format(list[i].msg:sub(1, 40)) end
      error(("raw subscriber: timed out waiting for %s (%d messages; the last: %s)"):format(
        what or "messages", #list, table.concat(got, ", ")), 2)
    end
  end
  return list
end

-- Control connections, one per Redis port (reconnected when they break).
local ctl, passwords = {}, {}

local function rq(port, ...)
  for attempt = 1, 2 do
    local r = ctl[port]
    if not r then
      local err
      r, err = Resp.connect(port, passwords[port])
      if not r then error(("redis on port %d: %s"):format(port, err), 2) end
      ctl[port] = r
    end
    local ok, v = pcall(r.call, r, ...)
    if ok then return v end
    r:close()
    ctl[port] = nil
    if attempt == 2 then error(v, 2) end
  end
end

local function close_ctl(port)
  if ctl[port] then ctl[port]:close() end
  ctl[port] = nil
end

-- Redis connections subscribed to `ch` (PUBSUB NUMSUB).
local function numsub(port, ch)
  local v = rq(port, "PUBSUB", "NUMSUB", ch)
  return v[2]
end

local function wait_numsub(port, ch, n, what, timeout)
  local last
  H.wait_for(function()
    last = numsub(port, ch)
    return last == n
  end, timeout or H.T(5), function()
    return ("%d Redis subscriber(s) of %q (have %s)%s"):format(n, ch, tostring(last),
      what and (": " .. what) or "")
  end)
end

---------------------------------------------------------------------------
-- redis-server processes
---------------------------------------------------------------------------

local function which(name)
  for dir in (os.getenv("PATH") or "/usr/bin:/bin"):gmatch("[^:]+") do
    local p = dir .. "/" .. name
    if lfs.attributes(p, "mode") == "file" then return p end
  end
end

local REDIS_SERVER = os.getenv("MOONPORT_TEST_REDIS_SERVER") or which("redis-server")
  or "/usr/sbin/redis-server"

local function redis_argv(port, extra)
  local argv = { REDIS_SERVER, "--port", tostring(port), "--bind", "127.0.0.1",
    "--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", "/tmp",
    "--loglevel", "warning" }
  for _, a in ipairs(extra or {}) do argv[#argv + 1] = a end
  return argv
end

-- True once Redis on `port` answers PING (with NOAUTH when it has a
-- password: it serves).
local function redis_answers(port)
  local c = socket.tcp()
  c:settimeout(0.5)
  local ok = c:connect("127.0.0.1", port)
  if not ok then c:close() return false end
  c:send(resp { "PING" })
  local line = c:receive("*l")
  c:close()
  return line == "+PONG" or (line or ""):find("NOAUTH", 1, true) ~= nil
end

-- A private redis-server for one test (H.spawn: killed by H.cleanup).
local function start_redis(port, extra)
  local srv = H.spawn(redis_argv(port, extra))
  H.wait_for(function()
    if not srv:alive() then error("redis-server exited: " .. srv:describe(), 0) end
    return redis_answers(port)
  end, H.T(10), function() return "redis-server on port " .. port .. ": " .. srv:describe() end)
  return srv
end

-- The file's shared redis-server: not tracked by H.cleanup (which kills
-- everything H.spawn started after each test), but killed with the test
-- runner (PR_SET_PDEATHSIG) if teardown never runs.
local shared = {}

local function spawn_kept(argv, log)
  local c_argv = ffi.new("const char *[?]", #argv + 1)
  for i, s in ipairs(argv) do c_argv[i - 1] = s end
  c_argv[#argv] = nil
  local fd = C.open(log, 1 + 0x40 + 0x200 + 0x80000, 420)     -- O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC
  local null = C.open("/dev/null", 0x80000, 0)
  assert(fd >= 0 and null >= 0, "open " .. log)
  local parent = C.getpid()
  io.stdout:flush(); io.stderr:flush()
  local pid = C.fork()
  if pid == 0 then
    C.prctl(1, H.SIGKILL, 0, 0, 0)            -- PR_SET_PDEATHSIG
    if C.getppid() ~= parent then C._exit(126) end
    C.dup2(null, 0); C.dup2(fd, 1); C.dup2(fd, 2)
    if C.syscall(436, ffi.cast("unsigned int", 3), ffi.cast("unsigned int", 0xffffffff),
        ffi.cast("int", 0)) ~= 0 then
      for f = 3, 4095 do C.close(f) end
    end
    for s = 1, 31 do if s ~= 9 and s ~= 19 then C.signal(s, nil) end end
    local set = ffi.new("mp_sigset_t")
    C.sigemptyset(set)
    C.sigprocmask(2, set, nil)
    C.execve(argv[1], c_argv, ffi.cast("const char **", C.environ))
    C._exit(127)
  end
  C.close(fd); C.close(null)
  assert(pid > 0, "fork failed")
  return pid
end

local function shared_redis()
  if shared.port then return shared.port end
  local env = tonumber(os.getenv("MOONPORT_TEST_REDIS_PORT") or "")
  if env then
    assert(redis_answers(env), "no Redis answers on MOONPORT_TEST_REDIS_PORT=" .. env)
    shared.port = env
    return env
  end
  shared.log = os.tmpname()
  for _ = 1, 3 do
    local port = H.free_port()
    local pid = spawn_kept(redis_argv(port), shared.log)
    local ok = pcall(H.wait_for, function()
      local st = ffi.new("int[1]")
      if C.waitpid(pid, st, 1) == pid then error("exited", 0) end
      return redis_answers(port)
    end, H.T(10))
    if ok then
      shared.port, shared.pid = port, pid
      return port
    end
    C.kill(pid, H.SIGKILL)
    C.waitpid(pid, nil, 0)
  end
  error("could not start redis-server (" .. REDIS_SERVER .. "): " .. (H.read_file(shared.log) or ""))
end

local function stop_shared()
  if shared.pid then
    close_ctl(shared.port)
    C.kill(shared.pid, H.SIGTERM)
    local st = ffi.new("int[1]")
    local deadline = H.now() + 5
    while C.waitpid(shared.pid, st, 1) ~= shared.pid do
      if H.now() > deadline then C.kill(shared.pid, H.SIGKILL) C.waitpid(shared.pid, st, 0) break end
      H.sleep(0.01)
    end
  end
  if shared.log then os.remove(shared.log) end
  shared = {}
end

---------------------------------------------------------------------------
-- /proc: which connections to Redis belong to a server
---------------------------------------------------------------------------

local function socket_inodes(pid)
  local set = {}
  local dir = "/proc/" .. pid .. "/fd"
  local ok, iter, state = pcall(lfs.dir, dir)
  if not ok then return set end
  for name in iter, state do
    local target = lfs.symlinkattributes(dir .. "/" .. name, "target")
    local inode = target and target:match("^socket:%[(%d+)%]$")
    if inode then set[inode] = true end
  end
  return set
end

-- Local ports of the established TCP connections of `pid` to port `rport`.
local function ports_to(pid, rport)
  local mine, ports = socket_inodes(pid), {}
  for _, f in ipairs { "/proc/net/tcp", "/proc/net/tcp6" } do
    local fh = io.open(f)
    if fh then
      for line in fh:lines() do
        local lport, rp, st, inode = line:match(
          "^%s*%d+:%s+%x+:(%x+)%s+%x+:(%x+)%s+(%x%x)%s+%S+%s+%S+%s+%S+%s+%d+%s+%d+%s+(%d+)")
        if lport and tonumber(rp, 16) == rport and st == "01" and mine[inode] then
          ports[tonumber(lport, 16)] = true
        end
      end
      fh:close()
    end
  end
  return ports
end

---------------------------------------------------------------------------
-- Bookkeeping so that no process outlives its test
---------------------------------------------------------------------------

local started, tracked = {}, {}

local function cleanup()
  for _, node in ipairs(started) do
    if node.srv:alive() then
      for _, p in ipairs(H.children(node.srv:pid())) do tracked[p] = true end
    end
  end
  for port in pairs(ctl) do
    if port ~= shared.port then close_ctl(port) end
  end
  passwords = {}
  local ok, err = pcall(H.cleanup)      -- SIGKILLs the servers still running
  for pid in pairs(tracked) do
    local cl = H.cmdline(pid)
    if H.running(pid) and cl and (cl:find(FIXTURE, 1, true) or cl:find(CLIENT_FIXTURE, 1, true)) then
      C.kill(pid, H.SIGKILL)
    end
  end
  started, tracked = {}, {}
  if not ok then error(err, 0) end
end

---------------------------------------------------------------------------
-- Clients of pubsub_node.lua: replies are lines, deliveries are
-- "D label kind clen mlen\n" frames followed by the channel and the message
---------------------------------------------------------------------------

local Client = require("spec.node_client")({})
Client.__index = Client

-- Parses what arrived (self.buf from self.pos) into replies and deliveries.
function Client:_parse()
  local buf, pos = self.buf, self.pos
  while true do
    local nl = buf:find("\n", pos, true)
    if not nl then break end
    local label, kind, clen, mlen = buf:sub(pos, nl - 1):match("^D (%S+) (%a) (%d+) (%d+)$")
    if label then
      clen, mlen = tonumber(clen), tonumber(mlen)
      local stop = nl + clen + mlen
      if #buf < stop then break end
      self.deliveries[#self.deliveries + 1] = {
        label = label, kind = kind,
        ch = buf:sub(nl + 1, nl + clen), msg = buf:sub(nl + clen + 1, stop),
      }
      pos = stop + 1
    else
      self.replies[#self.replies + 1] = buf:sub(pos, nl - 1)
      pos = nl + 1
    end
  end
  self.buf, self.pos = buf:sub(pos), 1
end

function Client:reply(timeout)
  self:wait(function() return #self.replies > 0 end, timeout, "a reply")
  return table.remove(self.replies, 1)
end

function Client:cmd(line, timeout)
  self:send(line .. "\n")
  return self:reply(timeout)
end

-- The next n deliveries, as sorted "label kind channel message" strings.
function Client:take(n, timeout)
  self:wait(function() return #self.deliveries >= n end, timeout, function()
    return ("%d deliveries (have %d)"):format(n, #self.deliveries)
  end)
  local got = {}
  for i = 1, n do
    local d = table.remove(self.deliveries, 1)
    got[i] = ("%s %s %s %s"):format(d.label, d.kind, d.ch, d.msg)
  end
  return sorted(got)
end

-- Everything delivered until a quiet period passes with nothing new.
function Client:drain()
  repeat
    local before = #self.deliveries
    local deadline = H.now() + Q()
    while H.now() < deadline and not self.closed do self:_fill(deadline) end
  until #self.deliveries == before
  local list = self.deliveries
  self.deliveries = {}
  return list
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

---------------------------------------------------------------------------
-- Servers
---------------------------------------------------------------------------

local Node = {}
Node.__index = Node

-- Starts pubsub_node.lua with --redis: opts.redis (a port on 127.0.0.1, or
-- a URL), opts.workers (-w; nil: one process), opts.threads, opts.subs
-- (start-up subscriptions "label:flags:channel" in every lane), opts.redis_env
-- (pass the URL in MOONPORT_REDIS instead). Waits until it serves (below)
-- unless opts.no_ready.
local function start(opts)
  local port = H.free_port()
  local args = { port }
  for _, s in ipairs(opts.subs or {}) do args[#args + 1] = s end
  local url = type(opts.redis) == "number" and ("redis://127.0.0.1:" .. opts.redis) or opts.redis
  local options, env = { "--redis", url }, opts.env
  if opts.redis_env then   -- MOONPORT_REDIS instead of the option
    options = {}
    env = { MOONPORT_REDIS = url }
  elseif opts.engine then  -- mp.engine { redis = url } in the script
    options = {}
    env = { PUBSUB_NODE_ENGINE = url }
  end
  if opts.workers then options[#options + 1] = "-w"; options[#options + 1] = opts.workers end
  local srv = H.start(FIXTURE, {
    args = args, wait_port = port, threads = opts.threads, options = options,
    env = env,
  })
  local node = setmetatable({ srv = srv, port = port, workers = opts.workers or 1,
    lanes = srv.threads, redis = opts.redis, name = opts.name or "server" }, Node)
  started[#started + 1] = node
  if not opts.no_ready then
    -- Every lane of a one-process server says "ready" at once. With
    -- workers, pubsub_node.lua's workers say it after a round trip through
    -- the root that goes through Redis (a subscription, then a publish on
    -- it), which a bug can lose (see "acknowledged subscription" below):
    -- wait for the root's line and for every worker to serve instead.
    H.wait_for(function()
      if not srv:alive() then error("server exited during start-up: " .. srv:describe(), 0) end
      if node.workers == 1 then return #srv:stdout_lines("^ready ") >= node.lanes end
      local kids = H.children(srv:pid())
      for _, p in ipairs(kids) do tracked[p] = true end
      return #srv:stdout_lines("^ready root ") == 1 and #kids == node.workers
    end, H.T(10), function() return "the server to start: " .. srv:describe() end)
    if node.workers > 1 then
      for _, cl in ipairs(node:one_per_worker()) do cl.c:close() end
    end
  end
  return node
end

function Node:describe() return self.name .. ": " .. self.srv:describe() end

-- Pids of the worker processes (the root's children) that run.
function Node:worker_pids()
  return H.children(self.srv:pid())
end

-- Sorted "pid:lane" keys of every lane of `pids` (plus the root lane).
function Node:keys(pids, root)
  local t = {}
  if root then t[#t + 1] = self.srv:pid() .. ":1" end
  for _, pid in ipairs(pids) do
    for l = 1, self.lanes do t[#t + 1] = pid .. ":" .. l end
  end
  return sorted(t)
end

-- Every lane of the server (the root's too).
function Node:all_keys()
  if self.workers > 1 then return self:keys(self:worker_pids(), true) end
  return self:keys({ self.srv:pid() })
end

-- Sorted "pid:lane" keys of the stdout deliveries to start-up subscriber
-- `label` of message `msg`.
function Node:S(label, msg)
  local t = {}
  for _, l in ipairs(self.srv:stdout_lines("^S ")) do
    local lb, pid, lane, m = l:match("^S (%S+) %a+ pid=(%d+) w=%d+ lane=(%d+) ch=%S* msg=(.*)$")
    if lb == label and m == msg then t[#t + 1] = pid .. ":" .. lane end
  end
  return sorted(t)
end

-- Waits for n stdout deliveries, then a quiet period; returns them.
function Node:wait_S(label, msg, n)
  H.wait_for(function() return #self:S(label, msg) >= n end, H.T(5), function()
    return ("%d stdout deliveries of %q to %s (have %d): %s"):format(n, msg, label,
      #self:S(label, msg), self:describe())
  end)
  H.sleep(Q())
  return self:S(label, msg)
end

function Node:client()
  local cl = setmetatable({ c = H.connect(self.port), buf = "", pos = 1, replies = {},
    deliveries = {}, node = self, name = "client" }, Client)
  local who = cl:cmd("who")
  local pid, w, lane, id = who:match("^who pid=(%d+) w=(%d+) lane=(%d+) id=(%d+) ")
  assert.truthy(pid, "bad reply to who: " .. who)
  cl.pid, cl.w, cl.lane, cl.id = tonumber(pid), tonumber(w), tonumber(lane), id
  cl.name = ("%s client (worker %d pid %d lane %d)"):format(self.name, cl.w, cl.pid, cl.lane)
  return cl
end

-- One client on each worker, in worker order.
function Node:one_per_worker()
  local by, n = {}, 0
  while count(by) < self.workers do
    n = n + 1
    assert(n <= 200, "clients on every worker: not after 200 connections")
    local cl = self:client()
    by[cl.w] = by[cl.w] or cl
  end
  local list = {}
  for w = 1, self.workers do list[w] = by[w] end
  return list
end

-- A client served by process `pid`.
function Node:client_on(pid)
  for _ = 1, 200 do
    local cl = self:client()
    if cl.pid == pid then return cl end
  end
  error("no client on pid " .. pid .. " after 200 connections")
end

-- SUBSCRIBE and PSUBSCRIBE counts of this server's connections to Redis on
-- `rport` (from CLIENT LIST: the root's, or the one process's, subscriber
-- connection), and how many connections it has there.
function Node:redis_subs(rport)
  local ports = ports_to(self.srv:pid(), rport)
  local list = rq(rport, "CLIENT", "LIST")
  local sub, psub, conns = 0, 0, 0
  for line in tostring(list):gmatch("[^\n]+") do
    local p = tonumber(line:match("^id=%d+ addr=[^ ]-:(%d+) "))
    if p and ports[p] then
      conns = conns + 1
      sub = sub + tonumber(line:match(" sub=(%d+)") or 0)
      psub = psub + tonumber(line:match(" psub=(%d+)") or 0)
    end
  end
  return sub, psub, conns
end

-- Waits until this server holds exactly `n` pattern subscriptions in Redis.
function Node:wait_psub(rport, n)
  local last
  H.wait_for(function()
    last = select(2, self:redis_subs(rport))
    return last == n
  end, H.T(5), function()
    return ("%s: %d PSUBSCRIBEd patterns in Redis (have %s)"):format(self.name, n, tostring(last))
  end)
end

-- No pub/sub or callback trouble on stderr (Redis connection log lines
-- are checked by the tests that expect them).
function Node:assert_clean_stderr()
  for _, l in ipairs(H.lines(self.srv:stderr())) do
    assert.is_nil(l:find("pub/sub", 1, true), self.name .. " stderr: " .. l)
    assert.is_nil(l:find("error in ", 1, true), self.name .. " stderr: " .. l)
    assert.is_nil(l:find("redis", 1, true), self.name .. " stderr: " .. l)
  end
end

function Node:stop()
  local st, how = self.srv:stop(H.SIGTERM, H.T(10))
  assert.equal(0, st, tostring(how) .. ": " .. self:describe())
end

-- redis_client.lua: a server and a line client.
local function start_client_fixture(url, opts)
  opts = opts or {}
  local port = H.free_port()
  local srv = H.start(CLIENT_FIXTURE, { args = { port, url }, wait_port = port,
    options = opts.options })
  local node = { srv = srv, port = port, name = "mp.redis server" }
  function node.describe() return srv:describe() end
  started[#started + 1] = node
  return node
end

local function line_client(node)
  local c = H.connect(node.port)
  local cl = {}
  function cl.cmd(line, timeout)
    local ok, err = H.send(c, line .. "\n", H.T(10))
    assert(ok, "send: " .. tostring(err))
    local reply, rerr = H.read_line(c, timeout or H.T(10))
    if not reply then
      error(("no reply to %q (%s): %s"):format(line:sub(1, 80), tostring(rerr), node.srv:describe()), 2)
    end
    return reply
  end
  function cl.line(timeout)
    local reply, rerr = H.read_line(c, timeout or H.T(10))
    if not reply then error(("no line (%s): %s"):format(tostring(rerr), node.srv:describe()), 2) end
    return reply
  end
  cl.c = c
  return cl
end

-- The canonical text (pubsub_node.lua's canon()) of the table that
-- "pubtable" publishes, once it went through JSON.
local TABLE_TEXT = '{"empty"="","list"={1=1,2="two",3={"three"=3}},"n"=42,"name"="moon",'
  .. '"nested"={"deep"={"deeper"={"s"="line\\010break \\034q\\034 \\092 tab\\009"}}},'
  .. '"no"=false,"ok"=true,"pi"=3.5}'

---------------------------------------------------------------------------

describe("redis", function()
  local R      -- the shared Redis's port

  setup(function()
    assert(lfs.attributes(REDIS_SERVER, "mode"), "redis-server not found (" .. REDIS_SERVER ..
      "): install it (bash scripts/setup) or set MOONPORT_TEST_REDIS_SERVER")
    R = shared_redis()
  end)
  teardown(stop_shared)
  after_each(cleanup)

  describe("pub/sub across servers (--redis)", function()
    it("the link to Redis has TCP keepalive (keepalive=SECS in the URL; 0: off), so a vanished Redis is found in seconds", function()
      -- `ss -tnpo`: the server's connection to Redis, and its timer
      local function link_line(pid)
        local p = io.popen("ss -tnpoH state established '( dport = :" .. R .. " )' 2>/dev/null")
        local out = p:read("*a")
        p:close()
        for line in out:gmatch("[^\n]+") do
          if line:find("pid=" .. pid .. ",", 1, true) then return line end
        end
      end
      local A = start { name = "A", redis = "redis://127.0.0.1:" .. R .. "?keepalive=7" }
      local line
      H.wait_for(function() line = link_line(A.srv:pid()); return line end, H.T(10), "the link in ss")
      assert.truthy(line:find("timer:(keepalive,", 1, true), line)
      local B = start { name = "B", redis = "redis://127.0.0.1:" .. R .. "?keepalive=0" }
      H.wait_for(function() line = link_line(B.srv:pid()); return line end, H.T(10), "the link in ss")
      assert.falsy(line:find("keepalive", 1, true), line)
    end)

    -- The subscriber link came up after the publisher's (a slow rediss://
    -- start under load): a publish sent then reached Redis before the
    -- re-SUBSCRIBEs, and the server's own subscribers never had it.
    it("a publish made while the subscriber link is still coming up waits for it and its SUBSCRIBEs: the server's own subscriber gets it, once", function()
      -- the relay holds the first connection it accepts (the subscriber
      -- link, made first) for a while; the publisher link is up at once
      local pport = H.free_port()
      local relay = H.spawn { "/usr/bin/python3", H.fixture("hold_first_proxy.py"),
        tostring(pport), tostring(R), tostring(H.T(2)) }
      H.wait_for(function() return relay:stdout():find("listening", 1, true) end, H.T(10),
        function() return "the relay: " .. relay:describe() end)
      local ch = token() .. ".early"
      local dir = H.tmpdir()
      local port = H.free_port()
      H.write_file(dir .. "/app.lua", ([[
        local mp = require "moonport"
        mp.on("start", function()
          mp.subscribe(%q, function(_, m) io.stdout:write("got ", m, "\n") io.stdout:flush() end)
          mp.publish(%q, "early")
        end)
        mp.http { port = %d, on_request = function(_, res) res:send("ok") end }
      ]]):format(ch, ch, port))
      -- /1: a SELECT, so a link is up only once Redis answered through the relay
      local srv = H.start(dir .. "/app.lua", { wait_port = port, threads = 1,
        options = { "-w", "1", "--redis", "redis://127.0.0.1:" .. pport .. "/1" } })
      H.wait_for(function() return srv:stdout():find("got early", 1, true) end, H.T(15),
        function() return "the early publish: " .. srv:describe() .. "\nrelay: " .. relay:stdout() end)
      assert.truthy(relay:stdout():find("relaying 2", 1, true), relay:stdout())
      H.sleep(Q())
      assert.equal(1, H.count_lines(srv:stdout(), "got early"), srv:stdout())
      relay:kill(H.SIGKILL)
    end)

    -- The root's loop ended one iteration after its stop handlers ran,
    -- before hiredis's write event: their publishes (and the workers'
    -- last ones, which reach the root as it stops) never left.
    it("publishes from mp.on(\"stop\") reach Redis, the root lane's too", function()
      local ch = token() .. ".bye"
      local raw = assert(Resp.connect(R))
      raw:send("SUBSCRIBE", ch)
      wait_numsub(R, ch, 1, "the plain subscriber")
      local A = start { name = "A", redis = R, workers = 2, env = { PUBSUB_NODE_STOP_PUB = ch } }
      local want = 1 + 2 * A.lanes -- the root's lane and every worker lane
      assert.equal(0, A.srv:stop())
      local msgs = raw:messages_until(function(l) return #l >= want end, H.T(10),
        want .. " publishes from stop handlers")
      local roots = 0
      for _, m in ipairs(msgs) do
        if m.msg:match("^stop root ") then roots = roots + 1 end
      end
      assert.equal(1, roots)
      raw:close()
    end)

    it("two servers with -w 2 on one Redis: a cluster publish reaches exact and pattern subscribers on both, once per subscription; tables arrive as tables; process, siblings and root stay in the server", function()
      local tok = token()
      local ch, pat, other = tok .. ".news", tok .. ".ne*", tok .. ".nexus"
      local A = start { name = "A", redis = R, workers = 2, subs = { "L:-:" .. ch } }
      local B = start { name = "B", redis = R, workers = 2, subs = { "L:-:" .. ch, "G:g:" .. pat } }
      local a = A:one_per_worker()
      local b = B:one_per_worker()
      local all = { a[1], a[2], b[1], b[2] }
      for _, c in ipairs(all) do
        c:sub("E", "-", ch)
        c:sub("P", "g", pat)
      end
      -- a plain Redis subscriber, to see what goes through Redis
      local raw = assert(Resp.connect(R))
      raw:send("SUBSCRIBE", ch)
      -- each server subscribes once, whatever number of subscribers it has
      wait_numsub(R, ch, 3, "A, B and the plain subscriber")
      A:wait_psub(R, 1)
      B:wait_psub(R, 1)

      -- from worker 1 of A: every subscription on both servers fires once
      a[1]:pub("-", ch, "hello")
      for _, c in ipairs(all) do
        assert.same({ "E s " .. ch .. " hello", "P s " .. ch .. " hello" }, c:take(2), c.name)
      end
      local keysA, keysB = A:all_keys(), B:all_keys()
      assert.same(keysA, A:wait_S("L", "hello", #keysA), "A: every lane's mp.subscribe, once")
      assert.same(keysB, B:wait_S("L", "hello", #keysB), "B: every lane's mp.subscribe, once")
      assert.same(keysB, B:wait_S("G", "hello", #keysB), "B: every lane's glob mp.subscribe, once")

      -- a table, from worker 1 of B
      b[1]:expect_reply("pubtable - " .. ch, "ok pub")
      for _, c in ipairs(all) do
        assert.same({ "E t " .. ch .. " " .. TABLE_TEXT, "P t " .. ch .. " " .. TABLE_TEXT },
          c:take(2), c.name)
      end

      -- Redis saw each publish once: the string as it is, the table as JSON
      local msgs = raw:messages_until(function(l) return #l >= 2 end, H.T(5), "two messages")
      assert.equal("hello", msgs[1].msg)
      assert.is_truthy(msgs[2].msg:find('"name":"moon"', 1, true), "JSON: " .. msgs[2].msg)
      assert.is_nil(raw:message(Q()), "a message published once reached Redis more than once")

      -- a plain Redis client publishes: a string on every moonport subscriber
      -- (Redis counts a receiver per matching subscription: A and B have
      -- the channel and the pattern each)
      assert.equal(5, rq(R, "PUBLISH", ch, "from-redis"))
      for _, c in ipairs(all) do
        assert.same({ "E s " .. ch .. " from-redis", "P s " .. ch .. " from-redis" }, c:take(2), c.name)
      end
      assert.equal("from-redis", raw:message().msg)

      -- a channel only the pattern matches
      a[2]:pub("-", other, "pattern-only")
      for _, c in ipairs(all) do
        assert.same({ "P s " .. other .. " pattern-only" }, c:take(1), c.name)
      end
      assert.same(keysB, B:wait_S("G", "pattern-only", #keysB))
      assert.same({}, A:S("L", "pattern-only"))

      -- the other scopes stay in the publisher's server
      a[1]:pub("process", ch, "p-local")
      assert.same({ "E s " .. ch .. " p-local", "P s " .. ch .. " p-local" }, a[1]:take(2))
      a[1]:pub("siblings", ch, "s-local")
      assert.same({ "E s " .. ch .. " s-local", "P s " .. ch .. " s-local" }, a[2]:take(2))
      a[1]:pub("root", ch, "r-local")
      assert.same({ A.srv:pid() .. ":1" }, A:wait_S("L", "r-local", 1))
      for _, m in ipairs { "p-local", "s-local", "r-local" } do
        assert.same({}, B:S("L", m), "B got " .. m)
        assert.same({}, B:S("G", m), "B got " .. m)
      end
      for _, c in ipairs(all) do c:assert_quiet() end
      assert.is_nil(raw:message(Q()), "a local scope went through Redis")
      raw:close()
      A:assert_clean_stderr()
      B:assert_clean_stderr()
      A:stop()
      B:stop()
    end)

    it("-w 1 (one process each): both servers get every message once per subscription, in order; a message twice is delivered twice; 1 MiB and binary channels go through", function()
      local tok = token()
      local ch, pat, big, bin = tok .. ".room", tok .. ".r*", tok .. ".big", tok .. ".b\0\255\r!"
      local X = start { name = "X", redis = R, subs = { "L:-:" .. ch } }
      local Y = start { name = "Y", redis = R, subs = { "L:-:" .. ch } }
      local x, y = X:client(), Y:client()
      for _, c in ipairs { x, y } do
        c:sub("E", "-", ch)
        c:sub("P", "g", pat)
        c:sub("B", "s", big)
        c:sub("N", "-", bin)
      end
      wait_numsub(R, ch, 2)
      wait_numsub(R, big, 2)
      wait_numsub(R, bin, 2)
      X:wait_psub(R, 1)
      Y:wait_psub(R, 1)

      x:pub("-", ch, "one")
      for _, c in ipairs { x, y } do
        assert.same({ "E s " .. ch .. " one", "P s " .. ch .. " one" }, c:take(2), c.name)
      end
      assert.same(X:all_keys(), X:wait_S("L", "one", #X:all_keys()))
      assert.same(Y:all_keys(), Y:wait_S("L", "one", #Y:all_keys()))

      -- the same message twice: two deliveries per subscription, not one
      x:pub("-", ch, "same")
      x:pub("-", ch, "same")
      for _, c in ipairs { x, y } do
        assert.same({ "E s " .. ch .. " same", "E s " .. ch .. " same",
          "P s " .. ch .. " same", "P s " .. ch .. " same" }, c:take(4), c.name)
      end

      -- 1,000 numbered messages from X arrive in order on Y, on both
      -- subscriptions
      x:expect_reply("pubseq - " .. ch .. " 1000", "ok pubseq 1000", H.T(10))
      local seq = { E = 0, P = 0 }
      for _, d in ipairs(y:collect(2000, H.T(20))) do
        seq[d.label] = seq[d.label] + 1
        assert.equal(tostring(seq[d.label]), d.msg, "message order on " .. d.label)
      end
      assert.same({ E = 1000, P = 1000 }, seq)
      x:collect(2000, H.T(20))

      -- 1 MiB of every byte value; a binary channel name
      x:expect_reply("pubbig - " .. big .. " 1048576", "ok pub", H.T(10))
      x:pubraw("-", bin, "\0\1\2\r\n")
      for _, c in ipairs { x, y } do
        assert.same({ "B s " .. big .. " len=1048576 gen=true", "N s " .. bin .. " \0\1\2\r\n" },
          c:take(2, H.T(10)), c.name)
      end

      -- process scope: the publisher's server only
      x:pub("process", ch, "mine")
      assert.same({ "E s " .. ch .. " mine", "P s " .. ch .. " mine" }, x:take(2))
      x:assert_quiet()
      y:assert_quiet()
      assert.same({}, Y:S("L", "mine"))
      X:assert_clean_stderr()
      Y:assert_clean_stderr()
      X:stop()
      Y:stop()
    end)


    it("the first subscriber in a server subscribes in Redis, the last one going unsubscribes: its connection closes, it cancels, or its worker is killed", function()
      local tok = token()
      local ch, pat = tok .. ".solo", tok .. ".so*"
      local A = start { name = "A", redis = R, workers = 2 }
      local c1, c2 = unpack(A:one_per_worker())
      assert.equal(0, numsub(R, ch))
      A:wait_psub(R, 0)
      c1:sub("E", "-", ch)
      c1:sub("P", "g", pat)
      wait_numsub(R, ch, 1, "after the first subscriber")
      A:wait_psub(R, 1)
      c2:sub("E", "-", ch)
      c2:sub("P", "g", pat)
      H.sleep(Q())
      assert.equal(1, numsub(R, ch), "one SUBSCRIBE per server")
      assert.equal(1, select(2, A:redis_subs(R)), "one PSUBSCRIBE per server")

      -- one of the two goes (its connection closes): the server stays
      -- subscribed and still delivers
      c1:send("close\n")
      local _, err = H.read_to_eof(c1.c, H.T(5))
      assert.is_true(err ~= "timeout", "the fixture did not close the connection")
      H.sleep(Q())
      assert.equal(1, numsub(R, ch), "another subscriber of the server remains")
      assert.equal(1, select(2, A:redis_subs(R)), "another pattern subscriber remains")
      assert.equal(2, rq(R, "PUBLISH", ch, "still"))
      assert.same({ "E s " .. ch .. " still", "P s " .. ch .. " still" }, c2:take(2))

      -- the last pattern subscriber cancels: PUNSUBSCRIBE
      c2:expect_reply("cancel P", "ok cancel P active=false")
      A:wait_psub(R, 0)
      assert.equal(1, numsub(R, ch))
      assert.equal(1, rq(R, "PUBLISH", ch, "exact-only"))
      assert.same({ "E s " .. ch .. " exact-only" }, c2:take(1))

      -- the last subscriber's connection closes: UNSUBSCRIBE
      c2:send("close\n")
      _, err = H.read_to_eof(c2.c, H.T(5))
      assert.is_true(err ~= "timeout", "the fixture did not close the connection")
      wait_numsub(R, ch, 0, "after the last subscriber's connection closed")
      assert.same({ n = 0 }, rq(R, "PUBSUB", "CHANNELS", tok .. "*"))
      assert.equal(0, rq(R, "PUBLISH", ch, "nobody"))

      -- the only subscriber's worker is killed: its root unsubscribes
      local victim = A:client_on(A:worker_pids()[1])
      victim:sub("K", "-", tok .. ".kill")
      victim:sub("KP", "g", tok .. ".ki*")
      wait_numsub(R, tok .. ".kill", 1)
      A:wait_psub(R, 1)
      assert.equal(0, C.kill(victim.pid, H.SIGKILL))
      wait_numsub(R, tok .. ".kill", 0, "after the subscriber's worker was killed")
      A:wait_psub(R, 0)
      assert.same({ n = 0 }, rq(R, "PUBSUB", "CHANNELS", tok .. "*"))

      -- a new first subscriber (on whichever worker serves it: the
      -- replacement or the other one) subscribes again
      local c3 = A:client()
      c3:sub("E", "-", ch)
      wait_numsub(R, ch, 1, "after a new subscriber")
      assert.equal(1, rq(R, "PUBLISH", ch, "again"))
      assert.same({ "E s " .. ch .. " again" }, c3:take(1))
      assert.is_true(A.srv:alive())
      A:stop()
    end)

    it("Redis restarted under running servers: both connections come back and subscribe again, later messages are delivered, publishes made meanwhile wait (the oldest dropped past 10,000); mp.redis reconnects, a waiting command hears \"connection lost\"", function()
      local tok = token()
      local ch, qch = tok .. ".news", tok .. ".queue"
      local P = H.free_port()
      local rsrv = start_redis(P)
      local A = start { name = "A", redis = P, workers = 2 }
      local B = start { name = "B", redis = P }
      local K = start_client_fixture("redis://127.0.0.1:" .. P)
      local a, b = A:client(), B:client()
      a:sub("E", "-", ch)
      b:sub("E", "-", ch)
      wait_numsub(P, ch, 2)
      a:pub("-", ch, "before")
      for _, c in ipairs { a, b } do assert.same({ "E s " .. ch .. " before" }, c:take(1), c.name) end
      -- mp.redis: a command that waits in Redis when it goes away
      local k1, k2 = line_client(K), line_client(K)
      assert.equal('= "OK" <nil>', k1.cmd("cmd SET " .. tok .. ".k v1"))
      assert(H.send(k2.c, "cmd BLPOP " .. tok .. ".list 0\n"))
      H.wait_for(function()
        return tostring(rq(P, "CLIENT", "LIST")):find("cmd=blpop", 1, true)
      end, H.T(5), "the BLPOP to block in Redis")

      rsrv:kill(H.SIGKILL)
      rsrv:wait_exit(H.T(5))
      close_ctl(P)
      local links = { "subscriber", "publisher" }
      local raw
      for _, n in ipairs { A, B } do
        for _, link in ipairs(links) do
          n.srv:wait_stderr(("moonport: redis (%s): lost the connection to 127.0.0.1:%d"):format(link, P),
            H.T(5), true)
        end
      end
      assert.equal('= <nil> "connection\\032lost"', k2.line())

      -- published while Redis is away: they wait
      a:pub("-", ch, "during-1")
      a:pub("-", ch, "during-2")
      b:expect_reply("pubseq - " .. qch .. " 10004", "ok pubseq 10004", H.T(30))
      B.srv:wait_stderr("moonport: redis: Redis is away and 10000 messages wait; dropping the oldest",
        H.T(5), true)
      b:pub("-", ch, "during-b")      -- the newest: kept
      assert.equal("connected false", k1.cmd("connected"))

      -- Redis comes back. Both servers retry (with a backoff); they are
      -- stopped (SIGSTOP) while it starts, so that a plain subscriber is
      -- there before they are
      for _, n in ipairs { A, B } do
        for _, link in ipairs(links) do
          n.srv:wait_stderr(("moonport: redis (%s): cannot connect to 127.0.0.1:%d: Connection refused (attempt 2; retrying)"):format(link, P),
            H.T(10), true)
        end
      end
      local SIGSTOP, SIGCONT = 19, 18
      assert.equal(0, C.kill(A.srv:pid(), SIGSTOP))
      assert.equal(0, C.kill(B.srv:pid(), SIGSTOP))
      local ok, err = pcall(function()
        start_redis(P) -- H.cleanup stops it
        raw = assert(Resp.connect(P))
        raw:send("SUBSCRIBE", ch, qch)
        assert.same({ "subscribe", ch, 1, n = 3 }, raw:read())
        assert.same({ "subscribe", qch, 2, n = 3 }, raw:read())
      end)
      C.kill(A.srv:pid(), SIGCONT)
      C.kill(B.srv:pid(), SIGCONT)
      assert(ok, err)
      wait_numsub(P, ch, 3, "A and B subscribed again", H.T(15))
      for _, n in ipairs { A, B } do
        for _, link in ipairs(links) do
          n.srv:wait_stderr(("moonport: redis (%s): connected to 127.0.0.1:%d"):format(link, P), H.T(10), true)
        end
      end
      -- what waited went out once Redis was back, in order, the 5 oldest of
      -- the 10,005 dropped
      local nq, nch = 0, 0
      local list = raw:messages_until(function(l)
        for i = nq + nch + 1, #l do
          if l[i].ch == qch then nq = nq + 1 else nch = nch + 1 end
        end
        return nq >= 9999 and nch >= 3
      end, H.T(20), "9,999 queued messages and the 3 published to " .. ch)
      local q, c = {}, {}
      for _, m in ipairs(list) do
        if m.ch == qch then q[#q + 1] = m.msg else c[#c + 1] = m.msg end
      end
      assert.equal(9999, #q)
      local bad
      for i = 1, #q do
        if q[i] ~= tostring(i + 5) then bad = ("message %d is %q, expected %q"):format(i, q[i], tostring(i + 5)) break end
      end
      assert.is_nil(bad, "the queued messages, in order, from the 6th")
      assert.same({ "during-1", "during-2", "during-b" }, sorted(c))
      assert.is_true(c[1] == "during-1" or c[2] == "during-1", "during-1 before during-2")

      -- later messages reach the moonport subscribers of both servers, once
      a:pub("-", ch, "after-1")
      b:pub("-", ch, "after-2")
      for _, cl in ipairs { a, b } do
        cl:wait(function()
          local n = 0
          for _, d in ipairs(cl.deliveries) do if d.msg:find("^after") then n = n + 1 end end
          return n >= 2
        end, H.T(10), "after-1 and after-2")
        -- what the servers got of the "during" messages depends on which
        -- of their two connections came back first; but nothing twice, and
        -- one publisher's messages in order
        local got, pos = {}, {}
        for i, d in ipairs(cl:drain()) do
          got[#got + 1] = d.msg
          assert.is_nil(pos[d.msg], cl.name .. ": delivered twice: " .. d.msg)
          pos[d.msg] = i
        end
        assert.is_truthy(pos["after-1"] and pos["after-2"], cl.name .. ": " .. table.concat(got, " "))
        if pos["during-1"] and pos["during-2"] then
          assert.is_true(pos["during-1"] < pos["during-2"], cl.name .. ": order " .. table.concat(got, " "))
        end
        for _, m in ipairs { "during-1", "during-2" } do
          if pos[m] then assert.is_true(pos[m] < pos["after-1"], cl.name .. ": order " .. table.concat(got, " ")) end
        end
        if pos["during-b"] then
          assert.is_true(pos["during-b"] < pos["after-2"], cl.name .. ": order " .. table.concat(got, " "))
        end
      end

      -- mp.redis connects again
      H.wait_for(function() return k1.cmd("connected") == "connected true" end, H.T(10),
        "mp.redis to reconnect")
      assert.equal('= "OK" <nil>', k1.cmd("cmd SET " .. tok .. ".k v2"))
      assert.equal('= "v2" <nil>', k1.cmd("cmd GET " .. tok .. ".k"))
      -- B's log: one line when it started dropping, one saying how many it
      -- dropped once Redis was back (5 of 10,005)
      local away, dropped = {}, {}
      for _, line in ipairs(H.lines(B.srv:stderr())) do
        if line:find("Redis is away", 1, true) then away[#away + 1] = line end
        if line:find("Redis was away", 1, true) then dropped[#dropped + 1] = line end
      end
      assert.same({ "moonport: redis: Redis is away and 10000 messages wait; dropping the oldest" }, away,
        "B's lines about dropping: " .. B:describe())
      assert.same({ "moonport: redis: Redis was away; dropped the 5 oldest messages waiting to be published" },
        dropped, "B's lines about what it dropped: " .. B:describe())

      assert.is_true(A.srv:alive() and B.srv:alive())
      raw:close()
      A:stop()
      B:stop()
    end)

    it("a refused password: a clear line on stderr for each connection, retried; the server keeps serving; the right password (and a database) works", function()
      local tok = token()
      local ch = tok .. ".auth"
      local P = H.free_port()
      local pw = "se cret"
      start_redis(P, { "--requirepass", pw })
      passwords[P] = pw
      local W = start { name = "W", redis = "redis://:wrong@127.0.0.1:" .. P }
      for _, attempt in ipairs { 1, 2 } do
        for _, link in ipairs { "subscriber", "publisher" } do
          W.srv:wait_stderr(("moonport: redis (%s): AUTH refused by 127.0.0.1:%d: WRONGPASS invalid username-password pair or user is disabled. (attempt %d; retrying)"):format(link, P, attempt),
            H.T(5), true)
        end
      end
      -- it serves: local pub/sub works
      assert.is_true(W.srv:alive())
      local w = W:client()
      w:sub("E", "-", ch)
      w:pub("process", ch, "local")
      assert.same({ "E s " .. ch .. " local" }, w:take(1))

      -- the right password, %-encoded in the URL, and a database
      local G = start { name = "G", redis = "redis://:se%20cret@127.0.0.1:" .. P .. "/2", workers = 2 }
      local g = G:client()
      g:sub("E", "-", ch)
      wait_numsub(P, ch, 1, "G only: W never got in")
      assert.equal(1, rq(P, "PUBLISH", ch, "hi"))
      g:pub("-", ch, "from-g")
      assert.same({ "E s " .. ch .. " from-g", "E s " .. ch .. " hi" }, g:take(2))
      w:assert_quiet()
      G:assert_clean_stderr()

      -- mp.redis: the password and the database from the URL
      local K = start_client_fixture("redis://:se%20cret@127.0.0.1:" .. P .. "/2")
      local k = line_client(K)
      assert.equal('= "OK" <nil>', k.cmd("cmd SET " .. tok .. ".k v"))
      local raw = assert(Resp.connect(P, pw))
      assert.equal("OK", raw:call("SELECT", 2))
      assert.equal("v", raw:call("GET", tok .. ".k"))
      assert.equal("OK", raw:call("SELECT", 0))
      assert.is_nil(raw:call("GET", tok .. ".k"))
      raw:close()
      -- a wrong one: the command gets an error, the log says why
      assert.equal("new", k.cmd("new " .. enc("redis://:nope@127.0.0.1:" .. P)))
      local sent = k.cmd("cb GET " .. tok .. ".k")
      if sent == "sent true <nil>" then
        local reply = k.line()
        assert.is_truthy(reply:find('^cb= <nil> "'), "a command behind a refused AUTH: " .. reply)
      else
        assert.equal('sent <nil> "not\\032connected"', sent)
      end
      K.srv:wait_stderr(("moonport: redis (mp.redis): AUTH refused by 127.0.0.1:%d: WRONGPASS"):format(P),
        H.T(5), true)

      assert.is_true(W.srv:alive())
      W:stop()
      G:stop()
    end)

    it("a refused password: what the server publishes meanwhile waits until Redis accepts it", function()
      local tok = token()
      local ch = tok .. ".wait"
      local P = H.free_port()
      start_redis(P, { "--requirepass", "first" })
      passwords[P] = "first"
      local W = start { name = "W", redis = "redis://:second@127.0.0.1:" .. P }
      for _, link in ipairs { "subscriber", "publisher" } do
        W.srv:wait_stderr(("moonport: redis (%s): AUTH refused by 127.0.0.1:%d: WRONGPASS"):format(link, P),
          H.T(5), true)
      end
      local w = W:client()
      for i = 1, 3 do w:pub("-", ch, "q" .. i) end
      -- at least one more attempt is refused after the publishes
      W.srv:wait_stderr(("moonport: redis (publisher): AUTH refused by 127.0.0.1:%d: WRONGPASS invalid username-password pair or user is disabled. (attempt 3; retrying)"):format(P),
        H.T(5), true)
      local raw = assert(Resp.connect(P, "first"))
      raw:send("SUBSCRIBE", ch)
      assert.same({ "subscribe", ch, 1, n = 3 }, raw:read())
      -- the server's password becomes the right one
      assert.equal("OK", rq(P, "CONFIG", "SET", "requirepass", "second"))
      W.srv:wait_stderr(("moonport: redis (publisher): connected to 127.0.0.1:%d"):format(P), H.T(10), true)
      w:pub("-", ch, "q4")
      local got = {}
      for _, m in ipairs(raw:messages_until(function(l)
        return #l > 0 and l[#l].msg == "q4"
      end, H.T(5), "q4")) do got[#got + 1] = m.msg end
      assert.same({ "q1", "q2", "q3", "q4" }, got, "what reached Redis")
      raw:close()
      W:stop()
    end)

    it("a pattern subscriber leaving while messages stream in: the exact subscriber of the same server still gets each message once", function()
      local tok = token()
      local X = start { name = "X", redis = R }
      local N = 5000
      local pubc = assert(Resp.connect(R))
      local ch, pat = tok .. ".dup", tok .. ".du*"
      local e, p = X:client(), X:client()
      e:sub("E", "-", ch)
      p:sub("P", "g", pat)
      wait_numsub(R, ch, 1)
      X:wait_psub(R, 1)
      -- a plain Redis client publishes N numbered messages at once; the
      -- pattern subscriber's connection closes while they stream in
      local cmds = {}
      for i = 1, N do cmds[i] = { "PUBLISH", ch, tostring(i) } end
      pubc:send_many(cmds)
      p:send("close\n")
      e:wait(function()
        local last = e.deliveries[#e.deliveries]
        return last and last.msg == tostring(N)
      end, H.T(20), "message " .. N)
      local got, dups, first_dup, order = {}, 0, nil, true
      local prev = 0
      for _, d in ipairs(e:drain()) do
        local n = tonumber(d.msg)
        if got[n] then
          dups = dups + 1
          first_dup = first_dup or n
        elseif n ~= prev + 1 then
          order = false
        end
        if not got[n] then prev = n end
        got[n] = true
      end
      assert.equal(N, count(got), "distinct messages delivered")
      assert.equal(0, dups, ("%d of %d messages delivered twice to the exact subscriber (the first: %s) after a pattern subscriber of the same server left"):format(
        dups, N, tostring(first_dup)))
      assert.is_true(order, "in order")
      for _ = 1, N do pubc:read(H.T(10)) end
      pubc:close()
      X:stop()
    end)

    it("a pattern subscriber arriving while identical messages stream in: the exact subscriber of the same server still gets every one", function()
      local tok = token()
      local X = start { name = "X", redis = R }
      local N = 5000
      local pubc = assert(Resp.connect(R))
      local ch, pat = tok .. ".same", tok .. ".sa*"
      local e, p = X:client(), X:client()
      e:sub("E", "-", ch)
      wait_numsub(R, ch, 1)
      local cmds = {}
      for i = 1, N do cmds[i] = { "PUBLISH", ch, "same" } end
      cmds[N + 1] = { "PUBLISH", ch, "end" }
      pubc:send_many(cmds)
      p:sub("P", "g", pat)
      e:wait(function()
        local last = e.deliveries[#e.deliveries]
        return last and last.msg == "end"
      end, H.T(20), "the last message")
      local same = 0
      for _, d in ipairs(e:drain()) do if d.msg == "same" then same = same + 1 end end
      assert.equal(N, same, ("identical messages delivered to the exact subscriber while a pattern subscriber of the same server arrived (of %d)"):format(N))
      pubc:close()
      X:stop()
    end)

    for _, W in ipairs { 1, 2 } do
      it(("-w %d: an acknowledged subscription gets a message published after it in the same server (200 channels: subscribe, then publish, on one connection)"):format(W), function()
        local tok = token()
        local X = start { name = "X", redis = R, workers = W > 1 and W or nil }
        local c = X:client()
        local N = 200
        local lines = {}
        for i = 1, N do
          lines[#lines + 1] = ("sub E%d - %s.race%d\npub - %s.race%d m%d\n"):format(i, tok, i, tok, i, i)
        end
        c:send(table.concat(lines))
        c:wait(function() return #c.replies >= 2 * N end, H.T(10), "the replies")
        for i = 1, 2 * N, 2 do
          assert.equal("ok sub E" .. ((i + 1) / 2), c.replies[i])
          assert.equal("ok pub", c.replies[i + 1])
        end
        local got = {}
        for _, d in ipairs(c:drain()) do got[d.label] = (got[d.label] or 0) + 1 end
        local missing, twice = {}, {}
        for i = 1, N do
          if not got["E" .. i] then missing[#missing + 1] = i end
          if (got["E" .. i] or 0) > 1 then twice[#twice + 1] = i end
        end
        assert.same({}, twice, "delivered twice")
        assert.equal(0, #missing, ("%d of %d subscribers missed the message published right after they subscribed (the SUBSCRIBE and the PUBLISH go to Redis on different connections); missed: %s"):format(
          #missing, N, table.concat(missing, " ", 1, math.min(#missing, 20))))
        X:stop()
      end)
    end

    it("a bad --redis URL or MOONPORT_REDIS: one line on stderr, exit status 1, nothing listening; MOONPORT_REDIS works like --redis", function()
      local cases = {
        { { "--redis", "http://x" }, nil, "moonport: --redis: 'http://x' is not a redis://, rediss:// or unix:// URL" },
        { { "--redis", "redis://127.0.0.1:99999" }, nil,
          "moonport: --redis: bad port in the Redis URL 'redis://127.0.0.1:99999'" },
        { { "--redis", "redis://127.0.0.1/x" }, nil,
          "moonport: --redis: bad database number in the Redis URL 'redis://127.0.0.1/x'" },
        { { "-w", "2" }, { MOONPORT_REDIS = "ftp://x" }, "moonport: --redis: 'ftp://x' is not a redis://, rediss:// or unix:// URL" },
      }
      for _, case in ipairs(cases) do
        local port = H.free_port()
        local args = {}
        for _, a in ipairs(case[1]) do args[#args + 1] = a end
        args[#args + 1] = H.fixture("echo.lua")
        args[#args + 1] = port
        local st, _, err = H.run(args, { env = case[2] })
        assert.equal(1, st, table.concat(args, " ") .. ": " .. err)
        assert.equal(case[3], H.one_line(err))
        assert.is_false(H.is_listening(port))
      end
      -- MOONPORT_REDIS: two servers, one with the variable
      local tok = token()
      local ch = tok .. ".env"
      local X = start { name = "X", redis = R, redis_env = true }
      local Y = start { name = "Y", redis = R }
      local x, y = X:client(), Y:client()
      x:sub("E", "-", ch)
      y:sub("E", "-", ch)
      wait_numsub(R, ch, 2)
      y:pub("-", ch, "via-env")
      assert.same({ "E s " .. ch .. " via-env" }, x:take(1))
      assert.same({ "E s " .. ch .. " via-env" }, y:take(1))
      X:stop()
      Y:stop()
    end)

    it("mp.engine { redis = url } at the script's top level works like --redis (workers too); a bad URL there stops the start with one line", function()
      local tok = token()
      local ch = tok .. ".engine"
      local X = start { name = "X", redis = R, engine = true, workers = 2 }
      local Y = start { name = "Y", redis = R }
      local x, y = X:client(), Y:client()
      x:sub("E", "-", ch)
      y:sub("E", "-", ch)
      wait_numsub(R, ch, 2)
      y:pub("-", ch, "via-engine")
      assert.same({ "E s " .. ch .. " via-engine" }, x:take(1))
      assert.same({ "E s " .. ch .. " via-engine" }, y:take(1))
      x:pub("-", ch, "from-x")
      assert.same({ "E s " .. ch .. " from-x" }, x:take(1))
      assert.same({ "E s " .. ch .. " from-x" }, y:take(1))
      X:stop()
      Y:stop()
      local port = H.free_port()
      local st, _, err = H.run({ "-w", "2", H.fixture("pubsub_node.lua"), port },
        { env = { PUBSUB_NODE_ENGINE = "redis://127.0.0.1:0" } })
      assert.equal(1, st, err)
      assert.truthy(H.one_line(err):find("mp.engine: bad port in the Redis URL", 1, true), err)
      assert.is_false(H.is_listening(port))
    end)
  end)

  describe("mp.redis", function()
    it("replies of every kind: strings (binary), status, integers, nil, arrays (nested, with false for nil), error replies; callbacks; 1,000 pipelined commands answered in order; the database from the URL", function()
      local tok = token()
      local K = start_client_fixture(("redis://127.0.0.1:%d/9"):format(R))
      local k = line_client(K)
      local key, n, l, none = enc(tok .. ".k"), enc(tok .. ".n"), enc(tok .. ".l"), enc(tok .. ".none")
      H.wait_for(function() return k.cmd("connected") == "connected true" end, H.T(5), "connected")
      assert.equal(("str redis client (127.0.0.1:%d/9)"):format(R), k.cmd("str"))
      assert.equal('= "OK" <nil>', k.cmd("cmd SET " .. key .. " v%00x%20y%0Az"))
      assert.equal('= "v\\000x\\032y\\010z" <nil>', k.cmd("cmd GET " .. key))
      assert.equal("= <nil> <nil>", k.cmd("cmd GET " .. none))
      assert.equal("= 1 <nil>", k.cmd("cmd INCR " .. n))
      assert.equal("= 2 <nil>", k.cmd("cmd INCR " .. n))
      assert.equal("= -3 <nil>", k.cmd("cmd INCRBY " .. n .. " #-5"))
      assert.equal('= "PONG" <nil>', k.cmd("cmd PING"))
      assert.equal('= <nil> "WRONGTYPE\\032Operation\\032against\\032a\\032key\\032holding\\032the\\032wrong\\032kind\\032of\\032value"',
        k.cmd("cmd LPUSH " .. key .. " x"))
      local unknown = k.cmd("cmd NOSUCHCOMMAND a")
      assert.is_truthy(unknown:find('^= <nil> "ERR\\032unknown\\032command'), unknown)
      -- numbers as arguments are sent as their text
      assert.equal("= 3 <nil>", k.cmd("cmd RPUSH " .. l .. " a b #3"))
      assert.equal('= {1="a",2="b",3="3"} <nil>', k.cmd("cmd LRANGE " .. l .. " 0 -1"))
      assert.equal("= {} <nil>", k.cmd("cmd LRANGE " .. none .. " 0 -1"))
      assert.equal('= {1="v\\000x\\032y\\010z",2=false,3="v\\000x\\032y\\010z"} <nil>',
        k.cmd("cmd MGET " .. key .. " " .. none .. " " .. key))
      assert.equal('= {1=1,2={1=2,2="b"},3="c"} <nil>',
        k.cmd("cmd EVAL " .. enc("return {1, {2, 'b'}, 'c'}") .. " 0"))
      assert.equal('= <nil> "ERR\\032boom"', k.cmd("cmd EVAL " .. enc("return redis.error_reply('ERR boom')") .. " 0"))
      assert.equal('= "2.5" <nil>', k.cmd("cmd INCRBYFLOAT " .. enc(tok .. ".f") .. " #2.5"))
      -- callbacks
      assert.equal("sent true <nil>", k.cmd("cb GET " .. key))
      assert.equal('cb= "v\\000x\\032y\\010z" <nil>', k.line())
      assert.equal("sent true <nil>", k.cmd("cb HSET " .. enc(tok .. ".h") .. " f1 a f2 b"))
      assert.equal("cb= 2 <nil>", k.line())
      assert.equal("sent true <nil>", k.cmd("cb LPUSH " .. key .. " x"))
      assert.is_truthy(k.line():find('^cb= <nil> "WRONGTYPE'))
      -- 1,000 INCRs with callbacks, then a waiting GET behind them
      assert.equal('pipe sent=1000 calls=1000 inorder=true first=1 last=1000 errors=0 get="1000" <nil>',
        k.cmd("pipe 1000 " .. enc(tok .. ".p"), H.T(20)))
      -- the database: 9, not 0
      local raw = assert(Resp.connect(R))
      assert.is_nil(raw:call("GET", tok .. ".k"), "the key went to database 0")
      assert.equal("OK", raw:call("SELECT", 9))
      assert.equal("v\0x y\nz", raw:call("GET", tok .. ".k"))
      assert.equal("1000", raw:call("GET", tok .. ".p"))
      raw:call("DEL", tok .. ".k", tok .. ".n", tok .. ".l", tok .. ".p", tok .. ".f", tok .. ".h")
      raw:close()
      -- r:close(): not connected any more
      assert.equal("closed", k.cmd("close"))
      assert.equal("connected false", k.cmd("connected"))
      assert.equal('sent <nil> "connection\\032closed"', k.cmd("cb GET " .. key))
      assert.is_true(K.srv:alive())
      assert.equal(0, (K.srv:stop()))
    end)

    it("a server whose lanes hold connected clients shuts down cleanly on SIGTERM (exit 0, no sanitizer report)", function()
      local K = start_client_fixture(("redis://127.0.0.1:%d"):format(R))
      local k = line_client(K)
      H.wait_for(function() return k.cmd("connected") == "connected true" end, H.T(5), "connected")
      assert.equal('= "PONG" <nil>', k.cmd("cmd PING"))
      assert.equal("sent true <nil>", k.cmd("cb PING"))
      assert.equal('cb= "PONG" <nil>', k.line())
      local st, how = K.srv:stop(H.SIGTERM, H.T(10))   -- raises on a sanitizer report
      assert.equal(0, st, tostring(how) .. ": " .. K.srv:describe())
    end)

    it("a bad argument is an error a script can catch with pcall, naming the argument, in both modes", function()
      local K = start_client_fixture(("redis://127.0.0.1:%d"):format(R))
      local k = line_client(K)
      H.wait_for(function() return k.cmd("connected") == "connected true" end, H.T(5), "connected")
      local ok, reply = pcall(k.cmd, "badarg")
      assert.is_true(ok, "no reply to badarg: the connection closed, the error escaped pcall; stderr:\n"
        .. K.srv:stderr():sub(-700))
      assert.equal("badarg wait=redis: argument 3 is a table (strings and numbers only) "
        .. "cb=redis: argument 3 is a table (strings and numbers only)",
        (reply:gsub("wait=[^ ]*:%d+: ", "wait=")))
    end)

    it("a client closed or collected from inside its own reply (waiting, in a callback with a command queued behind, by GC) frees nothing twice: the server goes on and stops clean (no sanitizer report)", function()
      local K = start_client_fixture(("redis://127.0.0.1:%d"):format(R))
      local k = line_client(K)
      for _, mode in ipairs { "wait", "cb", "gc", "wait", "cb", "gc" } do
        H.wait_for(function() return k.cmd("connected") == "connected true" end, H.T(5), "connected")
        assert.equal(('closeafter %s "PONG"'):format(mode), k.cmd("closeafter " .. mode))
        assert.is_nil(K.srv:sanitizer_report(), "after closeafter " .. mode)
      end
      H.wait_for(function() return k.cmd("connected") == "connected true" end, H.T(5), "connected")
      assert.equal('= "PONG" <nil>', k.cmd("cmd PING"))
      local st, how = K.srv:stop(H.SIGTERM, H.T(10))   -- raises on a sanitizer report
      assert.equal(0, st, tostring(how) .. ": " .. K.srv:describe())
    end)

    it("a waiting command on a client that is not connected (closed, or Redis away) returns nil and an error", function()
      local K = start_client_fixture(("redis://127.0.0.1:%d"):format(R))
      local k = line_client(K)
      H.wait_for(function() return k.cmd("connected") == "connected true" end, H.T(5), "connected")
      assert.equal("closed", k.cmd("close"))
      local ok, reply = pcall(k.cmd, "cmd GET x")
      assert.is_true(ok, "no reply to a waiting command on a closed client: the connection closed, "
        .. "the error escaped pcall; stderr:\n" .. K.srv:stderr():sub(-700))
      assert.is_truthy(reply:find('^= <nil> "'), reply)
      -- a client whose Redis is not there (between two attempts)
      local dead = H.free_port()
      k = line_client(K)
      assert.equal("new", k.cmd("new " .. enc("redis://127.0.0.1:" .. dead)))
      -- it connects on first use: r:connected() is one
      assert.equal("connected false", k.cmd("connected"))
      K.srv:wait_stderr(("redis (mp.redis): cannot connect to 127.0.0.1:%d: Connection refused (attempt 1; retrying)"):format(dead),
        H.T(5), true)
      local sent = k.cmd("cb GET x")
      if sent == "sent true <nil>" then    -- caught while connecting: it fails later
        assert.equal('cb= <nil> "connection\\032lost"', k.line())
      else
        assert.equal('sent <nil> "not\\032connected"', sent)
      end
      ok, reply = pcall(k.cmd, "cmd GET x")
      assert.is_true(ok, "no reply to a waiting command while Redis is away: the connection closed, "
        .. "the error escaped pcall; stderr:\n" .. K.srv:stderr():sub(-700))
      assert.is_truthy(reply:find('^= <nil> "'), reply)
    end)
  end)
end)
