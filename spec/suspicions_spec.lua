-- Issue 16's suspicions (items 6 to 13), each settled by a test through the
-- real binary where one can show it; see "Suspicions settled (issue 16)"
-- in docs/ARCHITECTURE.md for the ones argued in writing.
local H = require "spec.helper"

describe("issue 16 suspicions", function()
  after_each(H.cleanup)

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
