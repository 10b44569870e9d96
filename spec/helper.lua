-- spec/helper.lua: process control and client-socket helpers for the
-- moonport end-to-end specs. Runs under LuaJIT (uses the FFI).
--
--   local H = require "spec.helper"
--   after_each(H.cleanup)              -- kills leftover servers, closes clients
--   local srv = H.start("echo.lua", { args = { port }, wait_port = port })
--   local c = H.connect(port)
--   H.send(c, "hi"); assert.equal("hi", H.read_exact(c, 2))
--   assert.equal(0, srv:stop())        -- SIGTERM, wait, exit status
--
-- Every wait has a deadline. Deadlines are multiplied by H.scale (3 for an
-- ASan binary, 5 for TSan, MOONPORT_TEST_SCALE overrides) so use H.T(sec)
-- for "this should happen within sec seconds" bounds.

local ffi = require "ffi"
local bit = require "bit"
local socket = require "socket"
local unix = require "socket.unix"
local lfs = require "lfs"

ffi.cdef [[
typedef int mp_pid_t;
mp_pid_t fork(void);
int execve(const char *path, const char **argv, const char **envp);
void _exit(int status);
int dup2(int oldfd, int newfd);
int open(const char *path, int flags, int mode);
int close(int fd);
int kill(mp_pid_t pid, int sig);
mp_pid_t waitpid(mp_pid_t pid, int *status, int options);
mp_pid_t getpid(void);
mp_pid_t getppid(void);
int prctl(int option, unsigned long a2, unsigned long a3, unsigned long a4, unsigned long a5);
long syscall(long number, ...);
char *mkdtemp(char *template);
char *strerror(int errnum);
extern char **environ;
struct mp_timespec { long tv_sec; long tv_nsec; };
int clock_gettime(int clk, struct mp_timespec *ts);
struct mp_rlimit { uint64_t cur; uint64_t max; };
int getrlimit(int resource, struct mp_rlimit *rl);
int setrlimit(int resource, const struct mp_rlimit *rl);
struct mp_pollfd { int fd; short events; short revents; };
int poll(struct mp_pollfd *fds, unsigned long nfds, int timeout);
typedef void (*mp_sighandler_t)(int);
mp_sighandler_t signal(int sig, mp_sighandler_t handler);
typedef struct { unsigned long val[16]; } mp_sigset_t;
int sigemptyset(mp_sigset_t *set);
int sigprocmask(int how, const mp_sigset_t *set, mp_sigset_t *old);
]]

local C = ffi.C
local H = {}

-- Constants (Linux, x86-64 and arm64 agree on these).
local O_RDONLY, O_WRONLY, O_CREAT, O_TRUNC, O_CLOEXEC = 0, 1, 0x40, 0x200, 0x80000
local WNOHANG = 1
local SIG_SETMASK = 2
local PR_SET_PDEATHSIG = 1
local CLOCK_MONOTONIC = 1
local RLIMIT_NOFILE = 7
local SYS_close_range = (ffi.arch == "x64" or ffi.arch == "arm64") and 436 or nil

H.SIGHUP, H.SIGINT, H.SIGKILL, H.SIGTERM = 1, 2, 9, 15
H.POLLIN, H.POLLOUT, H.POLLERR, H.POLLHUP = 1, 4, 8, 16

---------------------------------------------------------------------------
-- Paths, scaling, time
---------------------------------------------------------------------------

local function abspath(p)
  if p:sub(1, 1) == "/" then return p end
  return lfs.currentdir() .. "/" .. p
end

H.root = lfs.currentdir()
H.bin = abspath(os.getenv("MOONPORT_BIN") or "build/moonport")
H.fixtures = H.root .. "/spec/fixtures"
H.test_threads = tonumber(os.getenv("MOONPORT_TEST_THREADS") or "")

H.scale = tonumber(os.getenv("MOONPORT_TEST_SCALE") or "")
if not H.scale then
  if H.bin:find("tsan", 1, true) then H.scale = 5
  elseif H.bin:find("asan", 1, true) then H.scale = 3
  else H.scale = 1 end
end

--- A sanitizer build (ASan keeps freed memory in quarantine, TSan shadows
--- it): its RSS says nothing about live memory, so memory bounds are only
--- asserted without one.
H.sanitized = H.bin:find("asan", 1, true) ~= nil or H.bin:find("tsan", 1, true) ~= nil

--- A deadline of `sec` seconds, stretched for slow (sanitizer) builds.
function H.T(sec) return sec * H.scale end

function H.now()
  local ts = ffi.new("struct mp_timespec")
  C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

function H.sleep(sec) socket.sleep(sec) end

local function errno_str() return ffi.string(C.strerror(ffi.errno())) end

--- Polls `fn` every `step` seconds until it returns a truthy value (which is
--- returned) or `timeout` seconds pass; then raises "timed out waiting for
--- <what>" (what may be a function returning extra context).
function H.wait_for(fn, timeout, what, step)
  local deadline = H.now() + (timeout or H.T(5))
  while true do
    local v = fn()
    if v then return v end
    if H.now() >= deadline then
      if type(what) == "function" then what = what() end
      error(("timed out after %.1fs waiting for %s"):format(timeout or H.T(5),
        what or "condition"), 2)
    end
    H.sleep(step or 0.01)
  end
end

function H.read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

function H.lines(text)
  local t = {}
  for line in (text or ""):gmatch("([^\n]*)\n") do t[#t + 1] = line end
  local tail = (text or ""):match("([^\n]+)$")
  if tail then t[#t + 1] = tail end
  return t
end

function H.exists(path) return lfs.attributes(path, "mode") ~= nil end

--- Whether `hay` contains `needle` (plain text, no patterns).
function H.plain(hay, needle) return hay:find(needle, 1, true) ~= nil end

--- How many lines of `text` contain `needle` (plain text).
function H.count_lines(text, needle)
  local n = 0
  for _, l in ipairs(H.lines(text)) do
    if H.plain(l, needle) then n = n + 1 end
  end
  return n
end

--- { [v] = true } for the values of a list.
function H.set_of(list)
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s
end

--- Absolute path of a fixture script.
function H.fixture(name)
  if name:find("/", 1, true) then return abspath(name) end
  return H.fixtures .. "/" .. name
end

--- Line number of the first line of a fixture that contains `text`.
function H.fixture_line(name, text)
  local n = 0
  for line in io.lines(H.fixture(name)) do
    n = n + 1
    if line:find(text, 1, true) then return n end
  end
  error("no line containing " .. text .. " in " .. name)
end

-- Temporary directories, removed by H.cleanup().
local tmpdirs = {}
function H.tmpdir()
  local buf = ffi.new("char[?]", 64, "/tmp/moonport-spec-XXXXXX")
  if C.mkdtemp(buf) == nil then error("mkdtemp: " .. errno_str()) end
  local dir = ffi.string(buf)
  tmpdirs[#tmpdirs + 1] = dir
  return dir
end

---------------------------------------------------------------------------
-- Resource limits, ports, /proc
---------------------------------------------------------------------------

--- Raises this process's RLIMIT_NOFILE soft limit to at least n (up to the
--- hard limit). Returns the new soft limit.
function H.raise_nofile(n)
  local rl = ffi.new("struct mp_rlimit")
  assert(C.getrlimit(RLIMIT_NOFILE, rl) == 0)
  if rl.cur < n then
    rl.cur = (rl.max < n) and rl.max or n
    C.setrlimit(RLIMIT_NOFILE, rl)
    C.getrlimit(RLIMIT_NOFILE, rl)
  end
  return tonumber(rl.cur)
end

local handed_out = {}
-- Ports below the kernel's ephemeral range (32768-60999 by default, from
-- which every client socket's local port comes: a port picked there can be
-- taken by some connection before the server listens on it), above the
-- well-known ones and those .ci/run's Redis may take (20000-31999 is
-- shared with it: a port it holds fails the bind below).
local PORT_LO, PORT_HI = 10000, 32000
math.randomseed(os.time() + C.getpid())
--- A TCP port that is free right now (a bind on 0.0.0.0 succeeds, then it
--- is closed), below the ephemeral range. Never returns the same port
--- twice in one run.
function H.free_port()
  for _ = 1, 200 do
    local port = math.random(PORT_LO, PORT_HI - 1)
    if not handed_out[port] then
      local s = assert(socket.tcp())
      s:setoption("reuseaddr", true)
      local ok = s:bind("0.0.0.0", port)
      s:close()
      if ok then
        handed_out[port] = true
        return port
      end
    end
  end
  error("could not find a free port")
end

--- Set of socket inodes LISTENing on TCP `port` (IPv4 or IPv6), from /proc.
function H.listening_inodes(port)
  local found = {}
  for _, f in ipairs { "/proc/net/tcp", "/proc/net/tcp6" } do
    local fh = io.open(f)
    if fh then
      for line in fh:lines() do
        local lport, st, inode = line:match(
          "^%s*%d+:%s+%x+:(%x+)%s+%x+:%x+%s+(%x%x)%s+%S+%s+%S+%s+%S+%s+%d+%s+%d+%s+(%d+)")
        if lport and tonumber(lport, 16) == port and st == "0A" then
          found[#found + 1] = inode
        end
      end
      fh:close()
    end
  end
  return found
end

function H.is_listening(port) return #H.listening_inodes(port) > 0 end

--- True if a Unix stream socket is listening at `path` (from /proc/net/unix).
function H.unix_listening(path)
  local fh = io.open("/proc/net/unix")
  if not fh then return false end
  local yes = false
  for line in fh:lines() do
    -- Num RefCount Protocol Flags Type St Inode Path
    local flags, p = line:match("^%x+:%s+%x+%s+%x+%s+(%x+)%s+%x+%s+%x+%s+%d+%s+(.+)$")
    if p == path and flags == "00010000" then yes = true break end
  end
  fh:close()
  return yes
end

--- Socket inodes open in process `pid`.
local function process_socket_inodes(pid)
  local set = {}
  local dir = "/proc/" .. pid .. "/fd"
  local ok, iter, state = pcall(lfs.dir, dir)
  if not ok then return set end
  for name in iter, state do
    if name ~= "." and name ~= ".." then
      local target = lfs.symlinkattributes(dir .. "/" .. name, "target")
      local inode = target and target:match("^socket:%[(%d+)%]$")
      if inode then set[inode] = true end
    end
  end
  return set
end

---------------------------------------------------------------------------
-- Processes
---------------------------------------------------------------------------

local function decode_status(st)
  local sig = bit.band(st, 0x7f)
  if sig == 0 then return bit.band(bit.rshift(st, 8), 0xff), "exit" end
  return 128 + sig, "signal", sig
end

local function build_env(overrides)
  local env, order = {}, {}
  local e = C.environ
  local i = 0
  while e[i] ~= nil do
    local kv = ffi.string(e[i])
    local k = kv:match("^([^=]*)=")
    if k and not env[k] then order[#order + 1] = k end
    if k then env[k] = kv:sub(#k + 2) end
    i = i + 1
  end
  -- One process unless a spec asks for workers (the binary's default is
  -- a worker per core); { MOONPORT_WORKERS = false } gets the default.
  overrides = overrides or {}
  if overrides.MOONPORT_WORKERS == nil and env.MOONPORT_WORKERS == nil then
    order[#order + 1] = "MOONPORT_WORKERS"
    env.MOONPORT_WORKERS = "1"
  end
  for k, v in pairs(overrides) do
    if env[k] == nil and v then order[#order + 1] = k end
    env[k] = v and tostring(v) or nil
  end
  local list = {}
  for _, k in ipairs(order) do
    if env[k] then list[#list + 1] = k .. "=" .. env[k] end
  end
  return list
end

local function cstr_array(list)
  local arr = ffi.new("const char *[?]", #list + 1)
  for i, s in ipairs(list) do arr[i - 1] = s end
  arr[#list] = nil
  return arr
end

-- Sanitizer reports that fail the test whose server printed them.
H.sanitizer_patterns = {
  "ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
  "WARNING: ThreadSanitizer",
}

local Server = {}
Server.__index = Server

-- "spec/e2e/x_spec.lua:12" of the spec line that started a process.
local function spec_caller()
  for level = 3, 20 do
    local info = debug.getinfo(level, "Sl")
    if not info then break end
    if info.short_src:find("_spec%.lua$") then
      return info.short_src .. ":" .. tostring(info.currentline)
    end
  end
  return "?"
end

local live = {}        -- servers started during the current test

--- Spawns argv (argv[1] is the program path) with stdout/stderr redirected
--- to files in a fresh temp dir and stdin from /dev/null (or the file
--- opts.stdin). All other fds are closed in the child, signal dispositions
--- and mask are reset, and the child gets SIGKILL if the test runner dies.
--- opts.env overrides the environment (a false value removes a variable).
function H.spawn(argv, opts)
  opts = opts or {}
  local dir = H.tmpdir()
  local out_path, err_path = dir .. "/stdout", dir .. "/stderr"
  local envl = build_env(opts.env)
  local c_argv, c_env = cstr_array(argv), cstr_array(envl)
  local out = C.open(out_path, O_WRONLY + O_CREAT + O_TRUNC + O_CLOEXEC, 420)
  local err = C.open(err_path, O_WRONLY + O_CREAT + O_TRUNC + O_CLOEXEC, 420)
  local null = C.open(opts.stdin or "/dev/null", O_RDONLY + O_CLOEXEC, 0)
  assert(out >= 0 and err >= 0 and null >= 0, "open: " .. errno_str())
  local parent = C.getpid()
  io.stdout:flush(); io.stderr:flush()
  local pid = C.fork()
  if pid == 0 then
    -- child: only plain C calls from here to exec
    C.prctl(PR_SET_PDEATHSIG, H.SIGKILL, 0, 0, 0)
    if C.getppid() ~= parent then C._exit(126) end
    C.dup2(null, 0); C.dup2(out, 1); C.dup2(err, 2)
    local closed = false
    if SYS_close_range then
      closed = C.syscall(SYS_close_range, ffi.cast("unsigned int", 3),
        ffi.cast("unsigned int", 0xffffffff), ffi.cast("int", 0)) == 0
    end
    if not closed then for fd = 3, 65535 do C.close(fd) end end
    for s = 1, 31 do
      if s ~= 9 and s ~= 19 then C.signal(s, nil) end
    end
    local set = ffi.new("mp_sigset_t")
    C.sigemptyset(set)
    C.sigprocmask(SIG_SETMASK, set, nil)
    C.execve(argv[1], c_argv, c_env)
    C._exit(127)
  end
  C.close(out); C.close(err); C.close(null)
  if pid < 0 then error("fork: " .. errno_str()) end
  local srv = setmetatable({
    _pid = pid, argv = argv, dir = dir, out_path = out_path, origin = spec_caller(),
    err_path = err_path, started = H.now(),
  }, Server)
  live[#live + 1] = srv
  return srv
end

function Server:pid() return self._pid end
function Server:stdout() return H.read_file(self.out_path) or "" end

-- Every line of moonport's own log has one fixed format (src/core/log.h):
--   2026-12-01T09:48:38.123Z warn w1 [4243] moonport: the message
-- (UTC time, level, process: root / wN, pid, source: moonport / lua).
-- H.log_fields(line) parses one such line: time, level, worker, pid,
-- source, message; nil for any other line (a sanitizer report, a script's
-- io.stderr:write). The specs match messages in the form "moonport: the
-- message", so Server:stderr() gives each well-formed line that way; a
-- line not in the format is left as it is (and fails such a match).
-- Server:raw_stderr() is the text as written; spec/e2e/log_spec.lua checks it.
local LOG_LEVELS = { error = true, warn = true, info = true, debug = true }
function H.log_fields(line)
  local ts, level, who, pid, source, msg = line:match(
    "^(%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%dZ) (%a+) (%S+) %[(%d+)%] (%a+): (.*)$")
  if not ts or not LOG_LEVELS[level] then return nil end
  if who ~= "root" and who ~= "-" and not who:match("^w%d+$") then return nil end
  return { time = ts, level = level, worker = who, pid = tonumber(pid), source = source, message = msg }
end

function H.strip_log(text)
  return (text:gsub("[^\n]+", function(line)
    local f = H.log_fields(line)
    if f then return f.source .. ": " .. f.message end
  end))
end

function Server:raw_stderr() return H.read_file(self.err_path) or "" end
function Server:stderr() return H.strip_log(self:raw_stderr()) end

--- Non-blocking reap. Returns status, how ("exit"/"signal") once exited.
function Server:poll()
  if self.status then return self.status, self.how end
  local st = ffi.new("int[1]")
  local r = C.waitpid(self._pid, st, WNOHANG)
  if r == self._pid then
    self.status, self.how, self.signal = decode_status(st[0])
    self.exited_at = H.now()
    return self.status, self.how
  elseif r < 0 then
    self.status, self.how = -1, "lost"
    return self.status, self.how
  end
  return nil
end

function Server:alive() return self:poll() == nil end

--- Waits up to `timeout` seconds for the process to exit. Returns the exit
--- status (128+N if killed by signal N) and "exit" or "signal"; or nil,
--- "timeout".
function Server:wait_exit(timeout)
  local deadline = H.now() + (timeout or H.T(10))
  while true do
    local st, how = self:poll()
    if st then return st, how end
    if H.now() >= deadline then return nil, "timeout" end
    H.sleep(0.005)
  end
end

--- Sends a signal (default SIGKILL) if the process is still running.
function Server:kill(sig)
  if self:alive() then C.kill(self._pid, sig or H.SIGKILL) end
  return true
end

--- Text describing the process and its output, for failure messages.
function Server:describe()
  local function tail(s, n)
    if #s > n then return "...\n" .. s:sub(-n) end
    return s
  end
  self:poll()
  local state = "running"
  if self.how == "signal" then state = "killed by signal " .. self.signal
  elseif self.status then state = self.how .. " status " .. self.status end
  return ("%s (pid %d, %s)\n--- stdout:\n%s\n--- stderr:\n%s"):format(
    table.concat(self.argv, " "), self._pid, state,
    tail(self:stdout(), 3000), tail(self:raw_stderr(), 4000))
end

--- Sanitizer report text from stderr, or nil.
function Server:sanitizer_report()
  local err = self:stderr()
  for _, pat in ipairs(H.sanitizer_patterns) do
    local at = err:find(pat, 1, true)
    if at then
      local from = math.max(1, at - 200)
      return err:sub(from, from + 6000)
    end
  end
  return nil
end

function Server:check_sanitizers()
  if self.sanitizer_checked then return end
  self.sanitizer_checked = true
  local rep = self:sanitizer_report()
  if rep then
    error(("sanitizer report from %s (pid %d, started at %s):\n%s"):format(
      table.concat(self.argv, " "), self._pid, self.origin, rep), 0)
  end
end

--- Sends `sig` (default SIGTERM) and waits up to `timeout` (default
--- H.T(15)) for the exit. Returns the exit status and how, like wait_exit;
--- if the process does not exit it is SIGKILLed and stop returns nil and a
--- message. Raises if stderr holds a sanitizer report.
function Server:stop(sig, timeout)
  if self:alive() then C.kill(self._pid, sig or H.SIGTERM) end
  local st, how = self:wait_exit(timeout or H.T(15))
  if not st then
    -- what it was doing, and its children (a worker stuck at exit, say),
    -- before the kill: the next failure says where it hung
    local children = table.concat(H.children(self._pid), ",")
    local state = H.proc_stat(self._pid) or "gone"
    C.kill(self._pid, H.SIGKILL)
    self:wait_exit(5)
    self:check_sanitizers()
    return nil, ("did not exit within %.1fs of signal %d (state %s, children %s): %s"):format(
      timeout or H.T(15), sig or H.SIGTERM, state, children ~= "" and children or "none", self:describe())
  end
  self:check_sanitizers()
  return st, how
end

--- VmRSS of the process in kB (nil if gone).
function Server:rss_kb()
  local s = H.read_file("/proc/" .. self._pid .. "/status")
  return s and tonumber(s:match("VmRSS:%s*(%d+)"))
end

--- Waits until stdout matches the Lua pattern `pat` (plain text if `plain`);
--- returns the match captures. Raises on timeout or if the process exits.
function Server:wait_stdout(pat, timeout, plain)
  local caps
  H.wait_for(function()
    local out = self:stdout()
    caps = { out:find(pat, 1, plain) }
    if caps[1] then return true end
    if not self:alive() then
      error(("server exited while waiting for %q on stdout: %s"):format(
        pat, self:describe()), 0)
    end
  end, timeout or H.T(5), function()
    return ("%q on stdout of %s"):format(pat, self:describe())
  end)
  if #caps > 2 then return select(3, unpack(caps)) end
  return self:stdout():sub(caps[1], caps[2])
end

--- Same for stderr.
function Server:wait_stderr(pat, timeout, plain)
  local m
  H.wait_for(function()
    local s, e = self:stderr():find(pat, 1, plain)
    if s then m = self:stderr():sub(s, e) return true end
  end, timeout or H.T(5), function()
    return ("%q on stderr of %s"):format(pat, self:describe())
  end)
  return m
end

--- Lines of stdout, optionally only those matching `pat`.
function Server:stdout_lines(pat)
  local t = {}
  for _, l in ipairs(H.lines(self:stdout())) do
    if not pat or l:find(pat) then t[#t + 1] = l end
  end
  return t
end

--- True if some socket of this process listens on TCP `port`.
function Server:listens_on(port)
  local mine = process_socket_inodes(self._pid)
  for _, inode in ipairs(H.listening_inodes(port)) do
    if mine[inode] then return true end
  end
  return false
end

---------------------------------------------------------------------------
-- Processes (/proc)
---------------------------------------------------------------------------

--- State letter and ppid of `pid`, or nil if there is no such process.
function H.proc_stat(pid)
  local s = H.read_file("/proc/" .. pid .. "/stat")
  if not s then return nil end
  local state, ppid = s:match("^%d+ %(.*%) (%a) (%-?%d+)")
  return state, tonumber(ppid)
end

--- Running (a zombie counts as gone: it holds no sockets, serves nothing).
function H.running(pid)
  local st = H.proc_stat(pid)
  return st ~= nil and st ~= "Z" and st ~= "X"
end

--- Every pid in /proc.
function H.all_pids()
  local t = {}
  for name in lfs.dir("/proc") do
    local pid = tonumber(name)
    if pid then t[#t + 1] = pid end
  end
  return t
end

--- Running children of `ppid`, sorted.
function H.children(ppid)
  local t = {}
  for _, pid in ipairs(H.all_pids()) do
    local st, pp = H.proc_stat(pid)
    if pp == ppid and st ~= "Z" and st ~= "X" then t[#t + 1] = pid end
  end
  table.sort(t)
  return t
end

--- The command line of `pid` with NULs as spaces, or nil.
function H.cmdline(pid)
  local s = H.read_file("/proc/" .. pid .. "/cmdline")
  return s and (s:gsub("%z", " "))
end

--- Checks stderr is exactly one line starting "moonport: " and returns it.
local assert = require "luassert"
function H.one_line(stderr)
  local lines = H.lines(stderr)
  assert.equal(1, #lines, "expected one line on stderr, got:\n" .. stderr)
  assert.equal("moonport: ", lines[1]:sub(1, 10), "stderr: " .. stderr)
  return lines[1]
end

--- True if process `pid` (any process, e.g. a server's child) holds a
--- socket listening on TCP `port`.
function H.pid_listens_on(pid, port)
  return Server.listens_on({ _pid = pid }, port)
end

--- Starts the moonport binary on a fixture script.
--   script      fixture name ("echo.lua") or a path
--   opts.args   script arguments (anything tostring-able)
--   opts.threads  -t value; defaults to MOONPORT_TEST_THREADS if set;
--                 false: never pass -t
--   opts.grace  -g value
--   opts.options  extra command-line options placed before the script
--   opts.env    environment overrides
--   opts.wait_port / opts.wait_path / opts.wait_stdout: do not return until
--               the server listens on that port / Unix path, or stdout
--               matches that pattern (raises if the process exits first)
--   opts.timeout  startup deadline (default H.T(10))
function H.start(script, opts)
  opts = opts or {}
  local f = io.open(H.bin, "rb")
  if not f then
    error("moonport binary not found at " .. H.bin ..
      " (build it with make, or set MOONPORT_BIN)", 2)
  end
  f:close()
  local argv = { H.bin }
  local threads = opts.threads
  if threads == nil then threads = H.test_threads end
  if threads then argv[#argv + 1] = "-t"; argv[#argv + 1] = tostring(threads) end
  if opts.grace then argv[#argv + 1] = "-g"; argv[#argv + 1] = tostring(opts.grace) end
  for _, o in ipairs(opts.options or {}) do argv[#argv + 1] = tostring(o) end
  argv[#argv + 1] = H.fixture(script)
  for _, a in ipairs(opts.args or {}) do argv[#argv + 1] = tostring(a) end

  local srv = H.spawn(argv, { env = opts.env })
  srv.threads = threads or 1
  local timeout = opts.timeout or H.T(10)
  local ok, err = pcall(H.wait_for, function()
    if not srv:alive() then
      error("server exited during startup: " .. srv:describe(), 0)
    end
    if opts.wait_port and not srv:listens_on(opts.wait_port) then return false end
    if opts.wait_path and not H.unix_listening(opts.wait_path) then return false end
    if opts.wait_stdout and not srv:stdout():find(opts.wait_stdout) then return false end
    return true
  end, timeout, function() return "server startup: " .. srv:describe() end)
  if not ok then
    srv:kill(H.SIGKILL)
    srv:wait_exit(5)
    error(err, 2)
  end
  return srv
end

--- The start and cleanup functions of a spec that serves one fixture on
--- fresh ports: `local start, cleanup = H.fixture_servers("app.lua")`.
--   start(extra, sopts)  H.start(fixture) on H.free_port(), waiting for the
--                        port; returns the server and the port
--     extra          script arguments after the port
--     sopts.threads / sopts.options / sopts.env   as for H.start
--     sopts.workers  -w N (before sopts.options)
--   cleanup()            for after_each: SIGKILLs the still-running worker
--                        children (their command line names the fixture)
--                        of every server start made, then H.cleanup(),
--                        which kills the roots
--   track(srv)           (third result) has cleanup treat a server started
--                        otherwise as one of start's
function H.fixture_servers(fixture)
  local started = {}
  local function track(srv)
    started[#started + 1] = srv
    return srv
  end
  local function start(extra, sopts)
    sopts = sopts or {}
    local port = H.free_port()
    local args = { port }
    for _, a in ipairs(extra or {}) do args[#args + 1] = a end
    local options = sopts.options
    if sopts.workers then
      options = { "-w", sopts.workers }
      for _, o in ipairs(sopts.options or {}) do options[#options + 1] = o end
    end
    local srv = H.start(fixture, {
      args = args, wait_port = port, threads = sopts.threads,
      options = options, env = sopts.env,
    })
    return track(srv), port
  end
  local function cleanup()
    for _, srv in ipairs(started) do
      if srv:alive() then
        for _, pid in ipairs(H.children(srv:pid())) do
          local cl = H.cmdline(pid)
          if cl and cl:find(fixture, 1, true) then C.kill(pid, H.SIGKILL) end
        end
      end
    end
    started = {}
    H.cleanup()
  end
  return start, cleanup, track
end

--- Runs the binary with exactly these arguments (no -t added) to
--- completion. Returns status, stdout, stderr, how. Raises if it does not
--- exit within `timeout` or printed a sanitizer report.
function H.run(args, opts)
  opts = opts or {}
  local argv = { H.bin }
  for _, a in ipairs(args) do argv[#argv + 1] = tostring(a) end
  local srv = H.spawn(argv, { env = opts.env })
  local st, how = srv:wait_exit(opts.timeout or H.T(10))
  if not st then
    srv:kill(H.SIGKILL)
    srv:wait_exit(5)
    error("did not exit: " .. srv:describe(), 2)
  end
  srv:check_sanitizers()
  return st, srv:stdout(), srv:stderr(), how, srv
end

--- Runs a tool (argv[1] is its path) to completion: status (nil if it was
--- killed after `opts.timeout`, default H.T(20)), stdout, stderr. opts.stdin
--- and opts.env as for H.spawn. Not judged for sanitizer reports.
function H.exec(argv, opts)
  opts = opts or {}
  local strs = {}
  for i, a in ipairs(argv) do strs[i] = tostring(a) end
  local p = H.spawn(strs, { env = opts.env, stdin = opts.stdin })
  p.sanitizer_checked = true
  local st = p:wait_exit(opts.timeout or H.T(20))
  if not st then
    p:kill(H.SIGKILL)
    p:wait_exit(5)
  end
  return st, p:stdout(), p:stderr()
end

--- Writes `data` to `path` (binary), raising on failure.
function H.write_file(path, data)
  local f = assert(io.open(path, "wb"))
  assert(f:write(data))
  assert(f:close())
end

---------------------------------------------------------------------------
-- A test certificate authority (openssl)
---------------------------------------------------------------------------

H.openssl = "/usr/bin/openssl"

local function openssl(args, what)
  local argv = { H.openssl }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local st, out, err = H.exec(argv)
  if st ~= 0 then
    error(("openssl %s (%s): %s\n%s"):format(args[1], what, tostring(st), err .. out), 3)
  end
  return out
end

local CA = {}
CA.__index = CA

--- Issues a server certificate for `name` signed by this CA, in its dir:
--- returns { cert =, key = } (PEM paths). The certificate's subject is
--- CN=<name> and it lists `name` (a DNS name, or an IP address) and any
--- opts.alt names (strings such as "DNS:b.test", "IP:::1") as
--- subjectAltName ("localhost" also lists IP:127.0.0.1 and IP:::1). opts.rsa: an RSA 2048 key instead of ECDSA P-256;
--- opts.file: the base name of the files (default `name`); opts.subject:
--- another subject, such as "/CN=localhost/O=v2".
function CA:issue(name, opts)
  opts = opts or {}
  local base = self.dir .. "/" .. (opts.file or name:gsub("[^%w%.%-]", "_"))
  local key, csr, cert, ext = base .. ".key", base .. ".csr", base .. ".pem", base .. ".ext"
  local alt = { (name:match("^[%d%.]+$") or name:find(":", 1, true)) and ("IP:" .. name)
    or ("DNS:" .. name) }
  if name == "localhost" then alt[2], alt[3] = "IP:127.0.0.1", "IP:::1" end
  for _, a in ipairs(opts.alt or {}) do alt[#alt + 1] = a end
  H.write_file(ext, "basicConstraints=critical,CA:FALSE\n" ..
    "keyUsage=critical,digitalSignature" .. (opts.rsa and ",keyEncipherment" or "") .. "\n" ..
    "extendedKeyUsage=serverAuth\nsubjectAltName=" .. table.concat(alt, ",") .. "\n")
  local newkey = opts.rsa and { "-newkey", "rsa:2048" }
    or { "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256" }
  local req = { "req", "-new", "-nodes", "-keyout", key, "-out", csr, "-subj", opts.subject or ("/CN=" .. name) }
  for i, a in ipairs(newkey) do table.insert(req, 2 + i, a) end
  openssl(req, name)
  self.serial = self.serial + 1
  openssl({ "x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key,
    "-set_serial", tostring(self.serial), "-days", "2", "-sha256", "-extfile", ext,
    "-out", cert }, name)
  return { cert = cert, key = key }
end

--- An intermediate CA signed by this one (CN=`name`, in this CA's dir):
--- a CA object like H.test_ca's whose `ca` is the intermediate's
--- certificate; what it issues needs that certificate sent along (the
--- server's `chain`) to verify against the root.
function CA:intermediate(name)
  local base = self.dir .. "/" .. name:gsub("[^%w%.%-]", "_")
  local sub = setmetatable({ dir = self.dir, ca = base .. ".ca.pem", ca_key = base .. ".ca.key",
    serial = self.serial + 5000 }, CA)
  H.write_file(base .. ".ca.ext", "basicConstraints=critical,CA:TRUE,pathlen:0\n" ..
    "keyUsage=critical,keyCertSign,cRLSign\n")
  openssl({ "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
    "-keyout", sub.ca_key, "-out", base .. ".ca.csr", "-subj", "/CN=" .. name }, name)
  self.serial = self.serial + 1
  openssl({ "x509", "-req", "-in", base .. ".ca.csr", "-CA", self.ca, "-CAkey", self.ca_key,
    "-set_serial", tostring(self.serial), "-days", "2", "-sha256", "-extfile", base .. ".ca.ext",
    "-out", sub.ca }, name)
  return sub
end

--- A test CA in a fresh temp dir (removed by H.cleanup): an ECDSA P-256
--- root "moonport test CA" valid for two days, and for each of `names` a
--- server certificate it signed (CA:issue). Returns the CA object:
--- ca.dir, ca.ca (the root's PEM, what clients trust), ca.ca_key, and
--- ca[name] = { cert =, key = } for each name; ca:issue(name, opts) makes
--- more.
function H.test_ca(names)
  local dir = H.tmpdir()
  local ca = setmetatable({ dir = dir, ca = dir .. "/ca.pem", ca_key = dir .. "/ca.key",
    serial = 1000 }, CA)
  openssl({ "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
    "-keyout", ca.ca_key, "-out", ca.ca, "-days", "2", "-sha256",
    "-subj", "/CN=moonport test CA",
    "-addext", "basicConstraints=critical,CA:TRUE",
    "-addext", "keyUsage=critical,keyCertSign,cRLSign" }, "the CA")
  for _, n in ipairs(names or {}) do ca[n] = ca:issue(n) end
  return ca
end

---------------------------------------------------------------------------
-- Clients
---------------------------------------------------------------------------

local clients = {}     -- closed by H.cleanup()
H.client_timeout = H.T(5)

local function track(c)
  clients[#clients + 1] = c
  return c
end

--- Connected TCP client (luasocket) with a timeout. opts: host (default
--- 127.0.0.1), timeout, rcvbuf/sndbuf (set before connecting: small values
--- make the kernel buffer little, so the server has to queue).
--- Raises on failure; see H.try_connect.
function H.try_connect(port, opts)
  opts = opts or {}
  local host = opts.host or "127.0.0.1"
  local c = host:find(":", 1, true) and socket.tcp6() or socket.tcp()
  if opts.rcvbuf then c:setoption("recv-buffer-size", opts.rcvbuf) end
  if opts.sndbuf then c:setoption("send-buffer-size", opts.sndbuf) end
  c:settimeout(opts.timeout or H.client_timeout)
  local ok, err = c:connect(host, port)
  if not ok then c:close() return nil, err end
  c:setoption("tcp-nodelay", true)
  return track(c)
end

function H.connect(port, opts)
  local c, err = H.try_connect(port, opts)
  if not c then error(("connect to port %s failed: %s"):format(port, err), 2) end
  return c
end

--- Connected Unix stream client.
function H.connect_unix(path, timeout)
  local c = unix.stream()
  c:settimeout(timeout or H.client_timeout)
  local ok, err = c:connect(path)
  if not ok then
    c:close()
    error(("connect to %s failed: %s"):format(path, err), 2)
  end
  return track(c)
end

--- Waits until fd is ready for `events` (default POLLIN) or timeout seconds.
function H.wait_fd(fd, events, timeout)
  local p = ffi.new("struct mp_pollfd[1]")
  p[0].fd = fd
  p[0].events = events or H.POLLIN
  local ms = math.max(0, math.floor((timeout or 0) * 1000 + 0.5))
  local r = C.poll(p, 1, ms)
  return r > 0, p[0].revents
end

--- poll(2) over a list of {fd=, events=} entries; returns the list of
--- revents (same order) and the number of ready entries.
function H.poll(entries, timeout)
  local n = #entries
  local p = ffi.new("struct mp_pollfd[?]", math.max(n, 1))
  for i, e in ipairs(entries) do
    p[i - 1].fd = e.fd
    p[i - 1].events = e.events or H.POLLIN
  end
  local r = C.poll(p, n, math.max(0, math.floor((timeout or 0) * 1000)))
  local rev = {}
  for i = 1, n do rev[i] = p[i - 1].revents end
  return rev, r
end

local function with_timeout(c, t, fn)
  local old = c.gettimeout and c:gettimeout() or H.client_timeout
  c:settimeout(t)
  local a, b, d = fn()
  c:settimeout(old)
  return a, b, d
end

--- Sends all of `data` within `timeout` seconds. Returns true or nil, err,
--- bytes_sent.
function H.send(c, data, timeout)
  local deadline = H.now() + (timeout or H.client_timeout)
  local pos = 1
  while pos <= #data do
    local rem = deadline - H.now()
    if rem <= 0 then return nil, "timeout", pos - 1 end
    local last, err, partial = with_timeout(c, rem, function()
      return c:send(data, pos)
    end)
    if last then return true end
    if partial and partial >= pos then pos = partial + 1 end
    if err ~= "timeout" then return nil, err, pos - 1 end
  end
  return true
end

--- Reads exactly n bytes within timeout. Returns data, or nil, err, partial.
function H.read_exact(c, n, timeout)
  local deadline = H.now() + (timeout or H.client_timeout)
  local parts, got = {}, 0
  while got < n do
    local rem = deadline - H.now()
    if rem <= 0 then return nil, "timeout", table.concat(parts) end
    local data, err, partial = with_timeout(c, rem, function()
      return c:receive(n - got)
    end)
    local s = data or partial
    if s and #s > 0 then parts[#parts + 1] = s; got = got + #s end
    if not data and err ~= "timeout" then
      return nil, err, table.concat(parts)
    end
  end
  return table.concat(parts)
end

--- Reads whatever arrives next (at least one byte) within timeout.
--- Returns data, or nil, "timeout" / "closed" / other error.
function H.read_some(c, timeout)
  local deadline = H.now() + (timeout or H.client_timeout)
  while true do
    local data, err, partial = with_timeout(c, 0, function()
      return c:receive(1048576)
    end)
    local s = data or partial
    if s and #s > 0 then return s end
    if err and err ~= "timeout" then return nil, err end
    local rem = deadline - H.now()
    if rem <= 0 then return nil, "timeout" end
    H.wait_fd(c:getfd(), H.POLLIN, rem)
  end
end

--- Reads until `want` (plain substring, or function(buf) -> truthy) is
--- satisfied. Returns the buffer, or nil, err, buffer.
function H.read_until(c, want, timeout)
  local deadline = H.now() + (timeout or H.client_timeout)
  local buf = ""
  local function done()
    if type(want) == "function" then return want(buf) end
    return buf:find(want, 1, true) ~= nil
  end
  while not done() do
    local data, err = H.read_some(c, deadline - H.now())
    if not data then return nil, err, buf end
    buf = buf .. data
  end
  return buf
end

--- Reads one "\n"-terminated line (without the newline) within timeout.
function H.read_line(c, timeout)
  local line, err, partial = with_timeout(c, timeout or H.client_timeout,
    function() return c:receive("*l") end)
  if line then return line end
  return nil, err, partial
end

--- Reads until the peer closes. Returns all data and "closed" (or the
--- error that ended it, e.g. "connection reset by peer"), or nil,
--- "timeout", data if the peer did not close in time.
function H.read_to_eof(c, timeout)
  local deadline = H.now() + (timeout or H.client_timeout)
  local parts = {}
  while true do
    local data, err = H.read_some(c, deadline - H.now())
    if data then
      parts[#parts + 1] = data
    elseif err == "timeout" then
      return nil, "timeout", table.concat(parts)
    else
      return table.concat(parts), err
    end
  end
end

-- GET `target` from 127.0.0.1:port on a new connection (Connection:
-- close); asserts a 200 and returns the body decoded as JSON. For the
-- fixtures whose routes answer what a script did as JSON.
function H.get_json(port, target, timeout)
  local c = H.connect(port)
  H.send(c, ("GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"):format(target))
  local data = H.read_to_eof(c, timeout or H.T(10))
  c:close()
  assert.truthy(data, "no response to " .. target)
  local st = tonumber(data:match("^HTTP/1%.1 (%d%d%d)"))
  assert.equal(200, st, data)
  return require("cjson").decode(data:match("\r\n\r\n(.*)$"))
end

-- The same through curl (a client we did not write), path on
-- 127.0.0.1:port: the body decoded as JSON, and the body.
function H.curl_json(port, path)
  local p = assert(io.popen(("/usr/bin/curl -s -w '\\n%%{http_code}' --max-time %d 'http://127.0.0.1:%d%s'")
    :format(math.ceil(H.T(20)), port, path)))
  local out = p:read("*a")
  p:close()
  local body, code = out:match("^(.*)\n(%d+)$")
  assert.equal("200", code, out)
  return require("cjson").decode(body), body
end

--- Asserts-style helper: returns true if nothing arrives (and the peer does
--- not close) for `dur` seconds; otherwise false and what happened.
function H.silent_for(c, dur)
  local data, err = H.read_some(c, dur)
  if data then return false, "received " .. ("%q"):format(data:sub(1, 200)) end
  if err ~= "timeout" then return false, err end
  return true
end

--- Sends `data` while reading whatever comes back, until `want` bytes
--- (default #data) arrived. For echoing more than the socket buffers hold
--- without deadlocking. Returns the received bytes, or nil, err, received.
function H.exchange(c, data, want, timeout)
  want = want or #data
  local deadline = H.now() + (timeout or H.T(20))
  local parts, got, pos = {}, 0, 1
  local old = c.gettimeout and c:gettimeout() or H.client_timeout
  c:settimeout(0)
  local result, err
  while true do
    if pos <= #data then
      local last, e, partial = c:send(data, pos, math.min(#data, pos + 262143))
      pos = (last or partial or pos - 1) + 1
      if e and e ~= "timeout" then err = "send: " .. e break end
    end
    local d, e, partial = c:receive(1048576)
    d = d or partial
    if d and #d > 0 then parts[#parts + 1] = d; got = got + #d end
    if got >= want then result = true break end
    if e and e ~= "timeout" then err = e break end
    if H.now() >= deadline then err = "timeout" break end
    if not d or #d == 0 then
      H.wait_fd(c:getfd(), pos <= #data and H.POLLIN + H.POLLOUT or H.POLLIN, 0.05)
    end
  end
  c:settimeout(old)
  if result then return table.concat(parts) end
  return nil, err, table.concat(parts)
end

--- Send `msg` and read back exactly `expect` (default msg).
function H.roundtrip(c, msg, expect, timeout)
  expect = expect or msg
  local ok, err = H.send(c, msg, timeout)
  if not ok then return nil, "send: " .. tostring(err) end
  return H.read_exact(c, #expect, timeout)
end

---------------------------------------------------------------------------
-- Cleanup
---------------------------------------------------------------------------

--- after_each: closes tracked clients, SIGKILLs servers still running,
--- removes temp dirs, and raises if any server printed a sanitizer report.
function H.cleanup()
  for _, c in ipairs(clients) do pcall(c.close, c) end
  clients = {}
  local reports = {}
  for _, srv in ipairs(live) do
    if srv:alive() then
      C.kill(srv._pid, H.SIGKILL)
      srv:wait_exit(5)
    end
    if not srv.sanitizer_checked then
      local ok, err = pcall(srv.check_sanitizers, srv)
      if not ok then reports[#reports + 1] = err end
    end
  end
  live = {}
  for _, d in ipairs(tmpdirs) do os.execute("rm -rf '" .. d .. "'") end
  tmpdirs = {}
  if #reports > 0 then error(table.concat(reports, "\n\n"), 0) end
end

return H
