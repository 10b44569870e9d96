-- Spec: replacing workers without losing requests: SIGUSR1 restarts the
-- workers one at a time (a new one serves before the old one stops), and
-- --max-memory replaces a worker that grows past the limit.
local H = require "spec.helper"
local ffi = require "ffi"

local children = H.children

-- One request on a fresh connection; the pid that answered, or nil, err.
local function ask(port)
  local c, err = H.try_connect(port, { timeout = H.T(3) })
  if not c then return nil, err end
  local ok, e = H.send(c, "x", H.T(3))
  if not ok then c:close() return nil, e end
  local got, e2 = H.read_until(c, ":x", H.T(3))
  c:close()
  if not got then return nil, e2 end
  return tonumber(got:match("^(%d+):x"))
end

describe("replacing workers", function()
  after_each(H.cleanup)

  it("a replaced worker finishes its open connections, up to --drain-timeout", function()
    local port = H.free_port()
    local srv = H.start("restart_node.lua", { threads = 1,
      options = { "-w", "2", "--drain-timeout", "1.5" }, args = { port }, wait_port = port })
    local root = srv:pid()
    H.wait_for(function() return #children(root) == 2 end, H.T(5), "two workers")
    -- a connection that never closes, on some worker
    local c = H.connect(port)
    assert.is_true(H.send(c, "x", H.T(5)))
    local pid = tonumber(assert(H.read_until(c, ":x", H.T(5))):match("^(%d+):x"))
    ffi.C.kill(root, 10) -- SIGUSR1
    -- the old process still serves its connection after the new one started
    H.wait_for(function() return #children(root) >= 3 end, H.T(10), "replacements")
    assert.equal(pid .. ":y", H.roundtrip(c, "y", pid .. ":y", H.T(5)))
    -- and is gone by the drain deadline (plus the shutdown), with the
    -- connection closed
    local t0 = H.now()
    assert.truthy(H.read_to_eof(c, H.T(10)))
    assert.is_true(H.now() - t0 < H.T(6))
    c:close()
    assert.equal(0, srv:stop())
  end)

  it("SIGUSR1 restarts every worker one at a time while requests keep succeeding", function()
    local port = H.free_port()
    local srv = H.start("restart_node.lua", { threads = 1, options = { "-w", "2" },
                                               args = { port }, wait_port = port })
    local root = srv:pid()
    H.wait_for(function() return #children(root) == 2 end, H.T(5), "two workers")
    local before = children(root)
    local failed, served, signalled = 0, 0, 0
    local t0 = H.now()
    while H.now() - t0 < H.T(4) do
      if signalled == 0 and H.now() - t0 > 0.5 then
        ffi.C.kill(root, 10) -- SIGUSR1
        signalled = 1
      end
      local pid, err = ask(port)
      if pid then served = served + 1 else failed = failed + 1; print("request failed: " .. tostring(err)) end
    end
    assert.equal(0, failed, "requests failed during the rolling restart")
    assert.is_true(served > 50, "too few requests were served: " .. served)
    local after
    H.wait_for(function()
      after = children(root)
      return #after == 2 and after[1] ~= before[1] and after[1] ~= before[2]
        and after[2] ~= before[1] and after[2] ~= before[2]
    end, H.T(10), function() return "both workers replaced: " .. srv:describe() end)
    -- the new workers serve
    local pid = assert(ask(port))
    assert.is_true(pid == after[1] or pid == after[2])
    assert.equal(0, srv:stop())
    assert.is_nil(srv:stderr():find("moonport: worker %d+ %(pid %d+%) was killed"))
  end)

  it("--max-memory replaces a worker that grows past the limit, with a log line", function()
    local port = H.free_port()
    local srv = H.start("restart_node.lua", { threads = 1,
      options = { "-w", "2", "--max-memory", "60", "--drain-timeout", "30" },
      args = { port }, wait_port = port })
    local root = srv:pid()
    H.wait_for(function() return #children(root) == 2 end, H.T(5), "two workers")
    local c = H.connect(port)
    assert.is_true(H.send(c, "grow", H.T(5)))
    local got = assert(H.read_until(c, ":grow", H.T(10)))
    local fat = tonumber(got:match("^(%d+):grow"))
    -- The replaced worker finishes its open connections first: this one
    -- stays open until after the replacement serves, then closes.
    H.wait_for(function() return #children(root) == 3 end, H.T(10),
      function() return "a replacement started: " .. srv:describe() end)
    assert.truthy(H.roundtrip(c, "x", fat .. ":x", H.T(5)))
    c:close()
    H.wait_for(function()
      local kids = children(root)
      return #kids == 2 and kids[1] ~= fat and kids[2] ~= fat
    end, H.T(10), function() return "the grown worker replaced: " .. srv:describe() end)
    assert.truthy(srv:stderr():find("moonport: worker %d %(pid " .. fat .. "%): uses %d+ MB, over %-%-max%-memory 60 MB"))
    -- the server still answers
    assert.truthy(ask(port))
    assert.equal(0, srv:stop())
  end)

  it("rejects a bad --max-memory", function()
    local status, _, err = H.run({ "--max-memory", "lots", H.fixture("restart_node.lua") })
    assert.equal(2, status)
    assert.truthy(err:find("^moonport: %-%-max%-memory"))
  end)
end)
