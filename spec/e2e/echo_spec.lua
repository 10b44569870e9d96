-- Spec 1 and 2: echo over TCP and Unix sockets; 1,000 concurrent clients.
local H = require "spec.helper"

describe("echo", function()
  after_each(H.cleanup)

  it("echoes over TCP", function()
    local port = H.free_port()
    local srv = H.start("echo.lua", { args = { port }, wait_port = port })
    local c = H.connect(port)
    assert.equal("hello\n", H.roundtrip(c, "hello\n"))
    -- a larger message, bigger than one 64 KiB read
    local big = ("0123456789abcdef"):rep(40000)          -- 640 000 bytes
    assert.is_true(H.send(c, big, H.T(10)))
    local back = H.read_exact(c, #big, H.T(10))
    assert.is_true(back == big, "640 kB echo differs")
    -- a second client on the same server
    local c2 = H.connect(port)
    assert.equal("second", H.roundtrip(c2, "second"))
    c:close(); c2:close()
    assert.equal(0, srv:stop())
    assert.is_false(H.is_listening(port))
  end)

  it("streams 16 MB through the echo while reading (queue above write_limit drains)", function()
    local port = H.free_port()
    local srv = H.start("echo.lua", { args = { port }, wait_port = port })
    local piece = {}
    for i = 1, 4096 do piece[i] = ("%06d|"):format(i) end
    piece = table.concat(piece):rep(2)              -- 57 344 bytes, no period of 2^k
    local data = piece:rep(math.ceil(16 * 1048576 / #piece))
    for round = 1, 2 do                             -- twice: the first must not break the second
      local c = H.connect(port)
      local back, err, part = H.exchange(c, data, #data, H.T(30))
      assert.truthy(back, ("round %d: echo stalled at %d of %d bytes (%s)\n%s"):format(
        round, #(part or ""), #data, tostring(err), srv:describe()))
      assert.is_true(back == data, "round " .. round .. ": echoed bytes differ")
      c:close()
    end
    assert.equal(0, srv:stop())
  end)

  it("echoes over a Unix socket and removes the socket file at exit", function()
    local dir = H.tmpdir()
    local path = dir .. "/echo.sock"
    local srv = H.start("echo.lua", { args = { path }, wait_path = path })
    assert.is_true(H.exists(path))
    local c = H.connect_unix(path)
    assert.equal("over unix\n", H.roundtrip(c, "over unix\n"))
    local c2 = H.connect_unix(path)
    assert.equal("two", H.roundtrip(c2, "two"))
    assert.equal("again", H.roundtrip(c, "again"))
    c:close(); c2:close()
    assert.equal(0, srv:stop())
    assert.is_false(H.exists(path), "socket file left behind: " .. path)
  end)

  it("replaces a stale Unix socket file", function()
    local unix = require "socket.unix"
    local path = H.tmpdir() .. "/stale.sock"
    local s = unix.stream()
    assert(s:bind(path))
    s:close()                              -- leaves the file, nobody listening
    assert.is_true(H.exists(path))
    local srv = H.start("echo.lua", { args = { path }, wait_path = path })
    local c = H.connect_unix(path)
    assert.equal("fresh", H.roundtrip(c, "fresh"))
    assert.equal(0, srv:stop())
  end)

  it("serves 1,000 concurrent clients, each gets exactly its own bytes", function()
    local N = 1000
    assert.is_true(H.raise_nofile(N + 200) >= N + 100, "cannot raise RLIMIT_NOFILE")
    local port = H.free_port()
    local srv = H.start("echo.lua", { args = { port }, wait_port = port })

    local clients, payload, got, fds = {}, {}, {}, {}
    for i = 1, N do
      clients[i] = H.connect(port, { timeout = H.T(10) })
      -- distinct content and length per client (20 .. 1 700 bytes)
      payload[i] = ("<%04d:%s>"):format(i, string.char(65 + i % 26)):rep(1 + i % 200)
      got[i] = {}
      fds[i] = { fd = clients[i]:getfd(), events = H.POLLIN }
    end
    -- every client is connected before anyone sends
    for i = 1, N do assert.is_true(H.send(clients[i], payload[i])) end

    local remaining, have = N, {}
    for i = 1, N do have[i] = 0 end
    local deadline = H.now() + H.T(30)
    while remaining > 0 and H.now() < deadline do
      local entries, idx = {}, {}
      for i = 1, N do
        if have[i] < #payload[i] then entries[#entries + 1] = fds[i]; idx[#idx + 1] = i end
      end
      local rev = H.poll(entries, 0.2)
      for k, r in ipairs(rev) do
        if r ~= 0 then
          local i = idx[k]
          local data, err = H.read_some(clients[i], 0)
          if data then
            got[i][#got[i] + 1] = data
            have[i] = have[i] + #data
            assert.is_true(have[i] <= #payload[i],
              ("client %d got more bytes than it sent"):format(i))
            if have[i] == #payload[i] then remaining = remaining - 1 end
          elseif err ~= "timeout" then
            error(("client %d: %s after %d of %d bytes"):format(i, err, have[i], #payload[i]))
          end
        end
      end
    end
    assert.equal(0, remaining, ("%d clients did not get all their bytes back"):format(remaining))
    for i = 1, N do
      local s = table.concat(got[i])
      assert.is_true(s == payload[i], ("client %d got other bytes: %q"):format(i, s:sub(1, 80)))
    end
    assert.is_true(srv:alive())
    for i = 1, N do clients[i]:close() end
    assert.equal(0, srv:stop())
  end)
end)
