-- Issue 16's suspicions (items 6 to 13), each settled by a test through the
-- real binary where one can show it; see "Suspicions settled (issue 16)"
-- in docs/ARCHITECTURE.md for the ones argued in writing.
local H = require "spec.helper"

describe("issue 16 suspicions", function()
  after_each(H.cleanup)

  describe("7: Redis up but not reading", function()
    local C = require("ffi").C            -- kill(2), declared by spec/helper.lua
    local SIGSTOP, SIGCONT = 19, 18
    local REDIS = os.getenv("MOONPORT_TEST_REDIS_SERVER") or "/usr/bin/redis-server"

    -- A private redis-server, then the fixture on it (one process, one
    -- lane; through it with `through_engine`).
    local function start(through_engine)
      local rport = H.free_port()
      local redis = H.spawn({ REDIS, "--port", tostring(rport), "--bind", "127.0.0.1",
        "--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", "/tmp",
        "--loglevel", "warning" })
      local socket = require "socket"
      H.wait_for(function()
        assert(redis:alive(), "redis-server exited: " .. redis:stderr())
        local c = socket.connect("127.0.0.1", rport)
        if c then c:close() end
        return c ~= nil
      end, H.T(10), "redis-server")
      local url = "redis://127.0.0.1:" .. rport
      local port = H.free_port()
      local options = { "-w", 1 }
      if through_engine then options[#options + 1] = "--redis"; options[#options + 1] = url end
      local srv = H.start("susp_redis.lua", { args = { port, url }, wait_port = port,
        threads = 1, options = options })
      local c = H.connect(port)
      assert.is_true(H.send(c, "ping\n"))
      assert.equal("ping PONG nil", H.read_line(c, H.T(5)))
      return srv, c, redis
    end

    it("r:cmd refuses with 'output buffer full' instead of buffering without end", function()
      local srv, c, redis = start(false)
      assert.equal(0, C.kill(redis:pid(), SIGSTOP))
      -- 100 MiB of SETs to a Redis that reads nothing
      assert.is_true(H.send(c, "flood 100 1048576\n"))
      local line = H.read_line(c, H.T(30))
      local sent, err = (line or ""):match("^flood sent=(%d+) err=(.*)$")
      assert.equal("output buffer full (Redis is slow to read)", err, line)
      assert.is_true(tonumber(sent) < 40, line)   -- 16 MiB buffered, plus the socket's
      assert.equal(0, C.kill(redis:pid(), SIGCONT))
      -- what was sent completes, and the client works again
      H.wait_for(function()
        assert.is_true(H.send(c, "done\n"))
        return H.read_line(c, H.T(5)) == "done " .. sent
      end, H.T(20), "the accepted SETs' callbacks")
      assert.is_true(H.send(c, "ping\n"))
      assert.equal("ping PONG nil", H.read_line(c, H.T(5)))
      assert.is_true(srv:alive())
    end)

    it("mp.publish through the engine refuses past 64 MiB waiting, then works again", function()
      local srv, c, redis = start(true)
      assert.equal(0, C.kill(redis:pid(), SIGSTOP))
      assert.is_true(H.send(c, "pub 100 1048576\n"))
      local line = H.read_line(c, H.T(30))
      local sent, err = (line or ""):match("^pub sent=(%d+) err=(.*)$")
      assert.equal("redis is behind: 64 MiB of messages wait to be sent (Redis is slow or away)",
        err, line)
      assert.is_true(tonumber(sent) < 70, line)
      assert.equal(0, C.kill(redis:pid(), SIGCONT))
      H.wait_for(function()
        assert.is_true(H.send(c, "pub 1 10\n"))
        return H.read_line(c, H.T(5)) == "pub sent=1 err=nil"
      end, H.T(20), "publishing to work again")
      assert.is_true(srv:alive())
    end)
  end)

  describe("8: a worker's lanes never block on the root", function()
    local release
    local function start()
      local port = H.free_port()
      release = H.tmpdir() .. "/release"
      local srv = H.start("susp_ipc.lua", { args = { port, release }, wait_port = port,
        threads = 1, options = { "-w", 2 } })
      local c = H.connect(port)
      H.wait_for(function()                 -- both workers serve
        assert.is_true(H.send(c, "ping\n"))
        return H.read_line(c, H.T(5)) == "pong"
      end, H.T(10), "a worker")
      return srv, c
    end

    local function flood(c, n, size)
      assert.is_true(H.send(c, ("flood %d %d\n"):format(n, size)))
      local line = H.read_line(c, H.T(30))
      local sent, ms, err = (line or ""):match("^flood sent=(%d+) ms=(%d+) err=(.*)$")
      assert.truthy(sent, line)
      return tonumber(sent), tonumber(ms), err
    end

    it("publishing 20 MB to a root that spins in Lua returns while it spins, and nothing is lost", function()
      local srv, c = start()
      -- the root spins until the spec lets it go: publishes that waited
      -- for it would never return
      assert.is_true(H.send(c, "busy hold\n"))
      assert.equal("busy", H.read_line(c, H.T(5)))
      local sent, _, err = flood(c, 2000, 10000)
      assert.equal(2000, sent)
      assert.equal("nil", err)
      assert.falsy(srv:stdout():find("root flood", 1, true), "the root was not held")
      H.write_file(release, "go\n")
      srv:wait_stdout("root flood 2000", H.T(15), true)
      assert.is_true(H.send(c, "ping\n"))
      assert.equal("pong", H.read_line(c, H.T(5)))
    end)

    it("past 64 MiB waiting for the root, mp.publish refuses with an error", function()
      local _, c = start()
      -- the root spins until the spec lets it go, so however long the
      -- publishes take on this machine, they return while it is busy, or
      -- (had they blocked on it) never
      assert.is_true(H.send(c, "busy hold\n"))
      assert.equal("busy", H.read_line(c, H.T(5)))
      local sent, _, err = flood(c, 100, 1048576)
      assert.equal("the root process is behind: 64 MiB of messages wait for it", err)
      assert.is_true(sent >= 60 and sent < 70, "sent " .. sent)
      H.write_file(release, "go\n")
      H.wait_for(function()                 -- the root catches up
        local n = flood(c, 1, 10)
        return n == 1
      end, H.T(20), "publishing to work again")
    end)
  end)

  describe("9: glob patterns", function()
    local function start()
      local port = H.free_port()
      local srv = H.start("susp_glob.lua", { args = { port }, wait_port = port, threads = 1 })
      return srv, H.connect(port)
    end

    it("subscribe takes a pattern of 256 bytes and refuses a longer one", function()
      local _, c = start()
      assert.is_true(H.send(c, "check\n"))
      assert.equal("256:ok|257:subscribe: pattern of 257 bytes (the limit is 256)|exact1000:ok",
        H.read_line(c, H.T(5)))
    end)

    it("a publish against 200 worst-case patterns costs a linear pass each", function()
      -- 200 patterns `*aaa...b###` of 256 bytes and 100 publishes on 4 KiB
      -- of `a`: 20,000 matches. The backtracking matcher needed about 2 ms
      -- for each (some 40 s); a linear one, about 20 us (under a second).
      local _, c = start()
      assert.is_true(H.send(c, "bench 100 200\n"))
      local line = H.read_line(c, H.T(60))
      local ms = tonumber(line)
      assert.is_number(ms)
      assert.is_true(ms < 5000 * H.scale, ("20,000 matches took %d ms"):format(ms))
    end)
  end)

  describe("10: req:read() and the request it belongs to", function()
    local function start()
      local port = H.free_port()
      local srv = H.start("susp_read.lua", { args = { port }, wait_port = port, threads = 1 })
      return srv, H.connect(port)
    end

    -- The body of the response that follows on c.
    local function body_of(c)
      local buf = H.read_until(c, function(b)
        local head = b:find("\r\n\r\n", 1, true)
        local n = head and tonumber(b:match("[Cc]ontent%-[Ll]ength: (%d+)"))
        return n and #b >= head + 3 + n
      end, H.T(5))
      assert.truthy(buf, "no whole response")
      local head = buf:find("\r\n\r\n", 1, true)
      return buf:sub(head + 4)
    end

    it("a req kept past its response does not read the next request's body", function()
      local srv, c = start()
      assert.is_true(H.send(c, "GET /keep HTTP/1.1\r\nHost: x\r\n\r\n"))
      assert.equal("kept", body_of(c))
      assert.is_true(H.send(c, "POST /late HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"))
      assert.equal("late got [hello]", body_of(c))
      srv:wait_stdout("stale read:", H.T(5), true)
      assert.equal("stale read:\ttrue\tnil\tclosed", srv:stdout():match("stale read:[^\n]*"))
    end)

    it("only the request's own handler may wait in req:read()", function()
      local srv, c = start()
      -- the body comes late, so a read from the timer would have to wait
      assert.is_true(H.send(c, "POST /timer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"))
      srv:wait_stdout("timer read:", H.T(5), true)
      H.sleep(0.4)
      assert.is_true(H.send(c, "hello"))
      assert.equal("timer got [hello]", body_of(c))
      assert.equal("timer read:\tfalse\treq:read: can wait only in the request's own handler "
        .. "(not in a timer or another callback)", srv:stdout():match("timer read:[^\n]*"))
    end)
  end)

  describe("13: out of memory while a callback's arguments are pushed", function()
    -- RLIMIT_AS can't be combined with a sanitizer's shadow memory.
    local sanitized = H.bin:find("/asan/", 1, true) or H.bin:find("/tsan/", 1, true)
    local socket = require "socket"

    -- The fixture under an 80 MB address-space limit, one process, one lane.
    local function start(hold)
      local port, echo = H.free_port(), H.free_port()
      local srv = H.spawn({ "/bin/sh", "-c", 'ulimit -v 80000 && exec "$0" "$@"', H.bin,
        "-w", "1", "-t", "1", H.fixture("susp_oom.lua"), tostring(port), tostring(hold),
        tostring(echo) })
      H.wait_for(function()
        assert(srv:alive(), "server exited: " .. srv:stderr())
        return srv:listens_on(port) and srv:listens_on(echo)
      end, H.T(10), "server to listen")
      return srv, port, echo
    end

    local function get(port, path)
      local c = H.connect(port)
      assert.is_true(H.send(c, "GET " .. path .. " HTTP/1.1\r\nHost: x\r\n\r\n"))
      local line = H.read_line(c, H.T(5))
      c:close()
      return line
    end

    it("a request that meets a full heap gets a 500 and the worker lives on", function()
      if sanitized then return pending("RLIMIT_AS and a sanitizer don't mix") end
      local srv, port = start(1500)
      -- one keep-alive connection, made while there is memory for it
      local c = H.connect(port)
      assert.is_true(H.send(c, "GET /fill HTTP/1.1\r\nHost: x\r\n\r\n"))
      assert.truthy(H.read_until(c, "filling\n", H.T(5)))
      socket.sleep(0.5)                  -- the heap is full from about 30 ms on
      assert.is_true(H.send(c, "GET /during HTTP/1.1\r\nHost: x\r\n\r\n"))
      local during = H.read_line(c, H.T(5))
      socket.sleep(0.2)                  -- a panicking process takes a moment to go
      assert.is_true(srv:alive(), "the process died: " .. srv:stderr())
      -- the 500, unless the heap was too full even for its write queue (the
      -- connection then just closes)
      if during ~= nil then assert.equal("HTTP/1.1 500 Internal Server Error", during) end
      assert.truthy(srv:stderr():find("out of memory while starting a callback", 1, true))
      H.wait_for(function() return srv:stderr():find("release", 1, true) end, H.T(5), "release")
      assert.equal("HTTP/1.1 200 OK", get(port, "/after"))
    end)

    it("data that meets a full heap closes its connection and the worker lives on", function()
      if sanitized then return pending("RLIMIT_AS and a sanitizer don't mix") end
      local srv, port, echo = start(1500)
      assert.equal("HTTP/1.1 200 OK", get(port, "/fill"))
      socket.sleep(0.5)
      local c = H.connect(echo)
      H.send(c, ("d"):rep(60000))        -- the server may close before it has all
      H.read_to_eof(c, H.T(5))           -- closed (or echoed, if memory came back)
      socket.sleep(0.2)
      assert.is_true(srv:alive(), "the process died: " .. srv:stderr())
      H.wait_for(function() return srv:stderr():find("release", 1, true) end, H.T(5), "release")
      local e = H.connect(echo)
      assert.equal("ok", H.exchange(e, "ok", 2))
    end)
  end)

  describe("12: the root reaps only its workers", function()
    it("io.popen in the root script: pclose collects the child after the root saw its SIGCHLD", function()
      local port = H.free_port()
      local srv = H.start("susp_popen.lua", {
        args = { port }, wait_port = port, options = { "-w", 2 },
      })
      srv:wait_stdout("popen ", H.T(10), true)
      local line = srv:stdout():match("popen [^\n]*")
      assert.equal("popen child-out true nil", line)
      assert.equal(0, srv:stop())
    end)
  end)
end)
