-- Spec 7: a Lua error in on_data closes only that connection (reason
-- "error") and is logged with file:line and a traceback; other clients and
-- new clients are served. A failing timer is stopped, other timers go on.
local H = require "spec.helper"

describe("Lua errors in callbacks", function()
  after_each(H.cleanup)

  it("close only the failing connection and are logged with a traceback", function()
    local port = H.free_port()
    local srv = H.start("error.lua", { args = { port }, wait_port = port })
    local a = H.connect(port)
    local b = H.connect(port)
    assert.equal("a1", H.roundtrip(a, "a1"))
    assert.equal("b1", H.roundtrip(b, "b1"))

    assert.is_true(H.send(a, "boom"))
    local data, how = H.read_to_eof(a, H.T(5))
    assert.equal("", data, "failing connection not closed: " .. tostring(how))
    srv:wait_stdout("close error", nil, true)

    local line = H.fixture_line("error.lua", 'error("boom requested")')
    local err = srv:wait_stderr("boom requested", nil, true)
    assert.truthy(err)
    local log = srv:stderr()
    assert.truthy(log:find("error.lua:" .. line .. ":", 1, true),
      "no error.lua:" .. line .. ": in stderr:\n" .. log)
    assert.truthy(log:find("stack traceback", 1, true), "no traceback in stderr:\n" .. log)
    -- the traceback goes through on_data's line too
    local caller = H.fixture_line("error.lua", "then explode() end")
    assert.truthy(log:find("error.lua:" .. caller, 1, true), "traceback lacks the caller:\n" .. log)

    -- b is still served, and so are new clients
    assert.equal("b2", H.roundtrip(b, "b2"))
    local c = H.connect(port)
    assert.equal("c1", H.roundtrip(c, "c1"))
    assert.is_true(srv:alive())
    assert.equal(1, #srv:stdout_lines("^close error$"), srv:stdout())
    assert.equal(0, srv:stop())
  end)

  it("stop only the failing timer", function()
    local port = H.free_port()
    local srv = H.start("error.lua", { args = { port }, wait_port = port })
    local runs = srv:wait_stdout("timer runs (%d+)", H.T(5))
    assert.equal("2", runs, "the failing timer kept running")
    local line = H.fixture_line("error.lua", 'error("timer failure")')
    srv:wait_stderr("error.lua:" .. line .. ": timer failure", nil, true)
    assert.truthy(srv:stderr():find("stack traceback", 1, true), srv:stderr())
    assert.is_true(srv:alive())
    local c = H.connect(port)
    assert.equal("still", H.roundtrip(c, "still"))
    assert.equal(0, srv:stop())
  end)
end)
