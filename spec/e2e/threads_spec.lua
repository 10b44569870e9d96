-- Spec 10: lanes. With -t 4 the script runs in 4 lanes, 200 connections
-- with interleaved numbered messages each get all their replies in order,
-- and more than one lane serves them. MOONPORT_THREADS and -t precedence.
local H = require "spec.helper"

local function lanes_reported(srv, n)
  srv:wait_stdout(("lane %d of %d"):format(n, n), nil, true)
  H.wait_for(function() return #srv:stdout_lines("^lane ") >= n end, H.T(5), "lane lines")
  local seen = {}
  for _, l in ipairs(srv:stdout_lines("^lane ")) do
    local lane, total = l:match("^lane (%d+) of (%d+)$")
    assert.equal(n, tonumber(total), srv:stdout())
    assert.is_nil(seen[lane], "lane " .. lane .. " ran the script twice")
    seen[lane] = true
  end
  for i = 1, n do assert.truthy(seen[tostring(i)], "no top level run in lane " .. i) end
end

describe("lanes", function()
  after_each(H.cleanup)

  it("-t 4: every connection gets its own replies, complete and in order, across lanes", function()
    local N, M = 200, 50
    local port = H.free_port()
    local srv = H.start("threads.lua", { args = { port }, wait_port = port, threads = 4 })
    lanes_reported(srv, 4)

    local conns, fds, buf, next_msg, lane_of = {}, {}, {}, {}, {}
    for i = 1, N do
      conns[i] = H.connect(port)
      fds[i] = { fd = conns[i]:getfd(), events = H.POLLIN }
      buf[i], next_msg[i] = "", 1
    end

    local function drain(wait)
      local entries, idx = {}, {}
      for i = 1, N do
        if next_msg[i] <= M then entries[#entries + 1] = fds[i]; idx[#idx + 1] = i end
      end
      local rev = H.poll(entries, wait)
      for k, r in ipairs(rev) do
        if r ~= 0 then
          local i = idx[k]
          local data, err = H.read_some(conns[i], 0)
          if not data and err ~= "timeout" then
            error(("conn %d: %s after %d replies"):format(i, err, next_msg[i] - 1))
          end
          buf[i] = buf[i] .. (data or "")
          while true do
            local line, rest = buf[i]:match("^([^\n]*)\n(.*)$")
            if not line then break end
            buf[i] = rest
            local lane, body = line:match("^(%d+) (.*)$")
            assert.equal(("c%d:m%d"):format(i, next_msg[i]), body,
              ("conn %d: reply out of order or foreign: %q"):format(i, line))
            lane_of[i] = lane_of[i] or lane
            assert.equal(lane_of[i], lane, ("conn %d changed lanes"):format(i))
            next_msg[i] = next_msg[i] + 1
          end
        end
      end
    end

    -- message m of every connection, round by round, reading as we go
    for m = 1, M do
      for i = 1, N do
        assert.is_true(H.send(conns[i], ("c%d:m%d\n"):format(i, m)))
      end
      drain(0)
    end
    local deadline = H.now() + H.T(30)
    local function missing()
      local n = 0
      for i = 1, N do if next_msg[i] <= M then n = n + 1 end end
      return n
    end
    while missing() > 0 and H.now() < deadline do drain(0.1) end
    assert.equal(0, missing(), "connections still waiting for replies")

    local lanes = {}
    for i = 1, N do lanes[lane_of[i]] = (lanes[lane_of[i]] or 0) + 1 end
    local used = 0
    for lane in pairs(lanes) do
      used = used + 1
      assert.is_true(tonumber(lane) >= 1 and tonumber(lane) <= 4, "bad lane " .. lane)
    end
    assert.is_true(used > 1, "all 200 connections were served by one lane")
    for i = 1, N do conns[i]:close() end
    assert.equal(0, srv:stop())
  end)

  it("takes the lane count from MOONPORT_THREADS, and -t wins over it", function()
    local port = H.free_port()
    local srv = H.start("threads.lua", {
      args = { port }, wait_port = port, threads = false, env = { MOONPORT_THREADS = "3" },
    })
    lanes_reported(srv, 3)
    assert.equal(0, srv:stop())

    port = H.free_port()
    srv = H.start("threads.lua", {
      args = { port }, wait_port = port, threads = 2, env = { MOONPORT_THREADS = "3" },
    })
    lanes_reported(srv, 2)
    H.sleep(0.2)
    assert.equal(2, #srv:stdout_lines("^lane "), srv:stdout())
    assert.equal(0, srv:stop())
  end)
end)
