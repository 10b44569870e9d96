-- mp.wait: a callback API's result turned into a wait, end to end through
-- spec/fixtures/client_app.lua.
local H = require "spec.helper"

local function ask(c, line)
  H.send(c, line .. "\n")
  return H.read_line(c, H.T(5))
end

describe("mp.wait", function()
  local app, port, c
  setup(function()
    port = H.free_port()
    app = H.start("client_app.lua", { args = { port }, wait_port = port })
  end)
  teardown(function()
    assert.equal(0, app:stop())
    H.cleanup()
  end)
  before_each(function() c = H.connect(port) end)
  after_each(function() c:close() end)

  it("returns every value wake got, later from a timer", function()
    assert.equal("ok late 42", ask(c, "wait_later 50"))
  end)

  it("returns at once when fn wakes before returning (nil values kept)", function()
    assert.equal("ok 1 nil 3", ask(c, "wait_now"))
  end)

  it("gives nil, \"timeout\" in time; a wake after it is a no-op returning false", function()
    local r = ask(c, "wait_timeout 100")
    local ms = tonumber(r:match("^err timeout (%d+) late=false$"))
    assert.truthy(ms, r)
    assert.is_true(ms >= 95 and ms < 1000 * H.T(0.6), r)
  end)

  it("a second wake is a no-op returning false", function()
    assert.equal("ok one second=false", ask(c, "wait_twice"))
  end)

  it("an error in fn is raised from mp.wait", function()
    assert.equal("ok false inner", ask(c, "wait_error"))
  end)
end)
