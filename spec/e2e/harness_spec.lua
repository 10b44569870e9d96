-- Self-tests of spec/helper.lua (process control and client helpers), run
-- against /bin/sh and luasocket so the harness is checked even without a
-- moonport binary.
local H = require "spec.helper"
local socket = require "socket"

describe("harness", function()
  after_each(H.cleanup)

  it("reports exit codes, signals and captured output", function()
    local p = H.spawn { "/bin/sh", "-c", "echo out; echo err >&2; exit 3" }
    assert.same({ 3, "exit" }, { p:wait_exit(5) })
    assert.equal("out\n", p:stdout())
    assert.equal("err\n", p:stderr())

    p = H.spawn { "/bin/sh", "-c", "kill -TERM $$; sleep 5" }
    assert.same({ 128 + 15, "signal" }, { p:wait_exit(5) })
  end)

  it("stops a process, and SIGKILLs one that ignores the signal", function()
    local p = H.spawn { "/bin/sh", "-c", "exec sleep 30" }
    assert.same({ 128 + 15, "signal" }, { p:stop() })

    p = H.spawn { "/bin/sh", "-c", "trap '' TERM; echo armed; exec sleep 30" }
    p:wait_stdout("armed")
    local t0 = H.now()
    local st, err = p:stop(H.SIGTERM, 0.3)
    assert.is_nil(st)
    assert.matches("did not exit", err)
    assert.is_false(p:alive())
    assert.is_true(H.now() - t0 < 3)
  end)

  it("gives children clean fds, signal dispositions and environment", function()
    local holder = assert(socket.bind("127.0.0.1", 0))   -- an fd the child must not get
    local p = H.spawn({ "/bin/sh", "-c",
      "ls -l /proc/$$/fd; grep SigIgn /proc/$$/status; echo \"X=$X Y=${Y-unset}\"" },
      { env = { X = "1", Y = false } })
    p:wait_exit(5)
    holder:close()
    local out = p:stdout()
    assert.is_nil(out:find("socket:", 1, true), "child inherited a socket:\n" .. out)
    assert.matches(" 0 %-> /dev/null", out)
    -- signals 1..31 (the low 31 bits): glibc keeps 32 and 33 for itself,
    -- and they may arrive ignored from whatever started the test run
    local ign = assert(out:match("SigIgn:%s+(%x+)\n"))
    assert.equal(0, tonumber(ign:sub(-8), 16) % 2 ^ 31, "SigIgn " .. ign)
    assert.matches("X=1 Y=unset", out)
  end)

  it("fails the test when a sanitizer report is on stderr", function()
    local p = H.spawn { "/bin/sh", "-c",
      "echo '==1==ERROR: AddressSanitizer: heap-use-after-free' >&2" }
    p:wait_exit(5)
    local ok, err = pcall(p.check_sanitizers, p)
    assert.is_false(ok)
    assert.matches("sanitizer report", err)
  end)

  it("finds listeners and reads with deadlines", function()
    local port = H.free_port()
    local srv = assert(socket.bind("127.0.0.1", port))
    assert.is_true(H.is_listening(port))
    local c = H.connect(port)
    srv:settimeout(2)
    local peer = assert(srv:accept())
    peer:send("hello world\nrest")
    assert.equal("hello", H.read_exact(c, 5))
    assert.equal(" world", H.read_line(c))
    assert.equal("rest", H.read_some(c, 1))
    local t0 = H.now()
    assert.same({ nil, "timeout" }, { H.read_some(c, 0.2) })
    assert.is_true(H.now() - t0 >= 0.15)
    assert.is_true(H.silent_for(c, 0.1))
    peer:send("tail")
    peer:close()
    assert.same({ "tail", "closed" }, { H.read_to_eof(c, 2) })
    srv:close()
    assert.is_false(H.is_listening(port))
  end)
end)
