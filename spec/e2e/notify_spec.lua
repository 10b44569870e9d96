-- Spec: the service manager protocol (systemd Type=notify). With
-- $NOTIFY_SOCKET set, moonport sends READY=1 once it serves (with -w N,
-- once every worker does), RELOADING=1 and READY=1 around a reload (its
-- end: every worker runs the new code, or the reload failed), and
-- STOPPING=1 on SIGTERM, each as one datagram. The spec binds the
-- datagram socket itself, as systemd does.
local H = require "spec.helper"
local ffi = require "ffi"

pcall(ffi.cdef, [[
struct mp_sockaddr_un { unsigned short sun_family; char sun_path[108]; };
int socket(int domain, int type, int protocol);
int bind(int fd, const struct mp_sockaddr_un *addr, unsigned len);
long recv(int fd, void *buf, unsigned long len, int flags);
]])
local C = ffi.C
local AF_UNIX, SOCK_DGRAM, SOCK_CLOEXEC, MSG_DONTWAIT = 1, 2, 0x80000, 0x40

local start, cleanup = H.fixture_servers("log_app.lua")

-- A bound datagram socket: path, or "@name" (abstract). Returns recv(t):
-- the next message within t seconds, or nil.
local fds = {}
local function listen(name)
  local fd = C.socket(AF_UNIX, SOCK_DGRAM + SOCK_CLOEXEC, 0)
  assert(fd >= 0)
  fds[#fds + 1] = fd
  local a = ffi.new("struct mp_sockaddr_un")
  a.sun_family = AF_UNIX
  ffi.copy(a.sun_path, name, #name)
  if name:sub(1, 1) == "@" then a.sun_path[0] = 0 end
  local len = 2 + #name + (name:sub(1, 1) == "@" and 0 or 1)
  assert(C.bind(fd, a, len) == 0, "bind " .. name)
  local buf = ffi.new("char[4096]")
  return function(t)
    local p = ffi.new("struct mp_pollfd[1]")
    p[0].fd, p[0].events = fd, H.POLLIN
    if C.poll(p, 1, math.floor((t or 0) * 1000)) <= 0 then return nil end
    local n = C.recv(fd, buf, 4096, MSG_DONTWAIT)
    if n < 0 then return nil end
    return ffi.string(buf, n)
  end
end

local function get(port, path)
  local c = H.connect(port)
  assert(H.send(c, "GET " .. path .. " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
  local data = H.read_to_eof(c, H.T(5))
  c:close()
  return data
end

describe("sd_notify", function()
  after_each(function()
    cleanup()
    for _, fd in ipairs(fds) do C.close(fd) end
    fds = {}
  end)

  it("-w 2: READY=1 once the workers serve, RELOADING=1 / READY=1 around reloads (failed ones too), STOPPING=1 on SIGTERM", function()
    local dir = H.tmpdir()
    local sock, pidfile, script = dir .. "/notify", dir .. "/moonport.pid", dir .. "/app.lua"
    local text = assert(H.read_file(H.fixture("log_app.lua")))
    local f = assert(io.open(script, "wb")); f:write(text); f:close()
    local recv = listen(sock)
    local port = H.free_port()
    local srv = H.start(script, { args = { port }, wait_port = port,
      options = { "-w", "2", "--pidfile", pidfile }, env = { NOTIFY_SOCKET = sock } })
    assert.equal("READY=1", recv(H.T(10)))
    -- it was sent once both workers serve
    for _ = 1, 4 do assert.truthy(get(port, "/hello"):find("\r\n\r\nhello\n$"), srv:describe()) end
    -- the root once, each lane of both workers (-t under MOONPORT_TEST_THREADS)
    assert.equal(1 + 2 * srv.threads, H.count_lines(srv:stdout(), "notify=nil"), srv:stdout())
    assert.equal(1 + 2 * srv.threads, #H.lines(srv:stdout()), srv:stdout())
    assert.is_nil(recv(0.2))

    local st, _, err = H.run({ "--reload", pidfile }, { timeout = H.T(20) })
    assert.equal(0, st, err)
    assert.truthy(recv(H.T(5)):match("^RELOADING=1\nMONOTONIC_USEC=%d+$"))
    assert.equal("READY=1\nSTATUS=serving", recv(H.T(10)))
    assert.is_nil(recv(0.2))

    f = assert(io.open(script, "wb")); f:write("error('broken on purpose')\n"); f:close()
    local out
    st, out = H.run({ "--reload", pidfile }, { timeout = H.T(20) })
    assert.equal(1, st, out)
    assert.truthy(recv(H.T(5)):match("^RELOADING=1\nMONOTONIC_USEC=%d+$"))
    assert.equal("READY=1\nSTATUS=the last reload failed; the old code serves", recv(H.T(5)))
    assert.truthy(get(port, "/hello"):find("\r\n\r\nhello\n$"))

    srv:kill(H.SIGTERM)
    assert.equal("STOPPING=1", recv(H.T(5)))
    assert.equal(0, srv:wait_exit(H.T(10)))
    assert.is_nil(recv(0.2))
  end)

  it("-w 1 on an abstract socket: READY=1 then STOPPING=1; a bad NOTIFY_SOCKET is a warning", function()
    local name = ("@moonport-spec-%d-%d"):format(C.getpid(), math.random(1e9))
    local recv = listen(name)
    local srv = start({}, { workers = 1, env = { NOTIFY_SOCKET = name } })
    assert.equal("READY=1", recv(H.T(5)))
    assert.equal(("notify=nil\n"):rep(srv.threads), srv:stdout())
    srv:kill(H.SIGTERM)
    assert.equal("STOPPING=1", recv(H.T(5)), srv:describe())
    assert.equal(0, srv:wait_exit(H.T(10)))
    assert.equal("", srv:stderr())

    local bad = start({}, { workers = 1, env = { NOTIFY_SOCKET = "relative/path" } })
    bad:wait_stderr("moonport: NOTIFY_SOCKET is not a socket path; not notifying the service manager", H.T(5), true)
    -- the warning comes as the process starts, before every lane has
    -- loaded the script (each prints one line): wait for them all
    bad:wait_stdout(("notify=nil\n"):rep(bad.threads), H.T(10), true)
    assert.equal(("notify=nil\n"):rep(bad.threads), bad:stdout())
    assert.equal(0, bad:stop())
  end)
end)
