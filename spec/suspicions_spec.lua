-- Issue 16's suspicions (items 6 to 13), each settled by a test through the
-- real binary where one can show it; see "Suspicions settled (issue 16)"
-- in docs/ARCHITECTURE.md for the ones argued in writing.
local H = require "spec.helper"

describe("issue 16 suspicions", function()
  after_each(H.cleanup)

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
