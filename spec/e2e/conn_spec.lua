-- Spec 12: the connection API: on_close reasons, peer, id, env, pause and
-- resume, close after the queue drains; mp.args / arg; require "cjson".
local H = require "spec.helper"

local function start(extra)
  local port = H.free_port()
  local args = { port }
  for _, a in ipairs(extra or {}) do args[#args + 1] = a end
  local srv = H.start("features.lua", { args = args, wait_port = port })
  return srv, port
end

local function cmd(c, line)
  assert.is_true(H.send(c, line .. "\n"))
  local reply, err = H.read_line(c)
  assert.truthy(reply, line .. ": " .. tostring(err))
  return reply
end

describe("connections", function()
  after_each(H.cleanup)

  it("report every on_close reason", function()
    local srv, port = start()
    local clients = {}
    for _, tag in ipairs { "P", "L", "T", "E", "S" } do
      clients[tag] = H.connect(port)
      assert.equal("tagged " .. tag, cmd(clients[tag], "tag " .. tag))
    end

    clients.P:close()                                         -- peer
    srv:wait_stdout("close P peer", nil, true)

    H.send(clients.L, "close\n")                              -- local
    assert.equal("", (H.read_to_eof(clients.L)))
    srv:wait_stdout("close L local", nil, true)

    assert.equal("timeout 1", cmd(clients.T, "idle 1"))        -- timeout
    local t0 = H.now()
    assert.equal("", (H.read_to_eof(clients.T, H.T(6))))
    assert.is_true(H.now() - t0 >= 0.8)
    srv:wait_stdout("close T timeout", nil, true)

    H.send(clients.E, "fail\n")                               -- error
    assert.equal("", (H.read_to_eof(clients.E)))
    srv:wait_stdout("close E error", nil, true)
    assert.truthy(srv:stderr():find("requested failure", 1, true), srv:stderr())

    assert.equal("count 1", cmd(clients.S, "count"))           -- shutdown
    assert.equal(0, srv:stop())
    srv:wait_stdout("close S shutdown", nil, true)
    assert.equal(5, #srv:stdout_lines("^close "), srv:stdout())
  end)

  it("peer() is the client's address, id() is distinct, env persists", function()
    local srv, port = start()
    local ids = {}
    for i = 1, 10 do
      local c = H.connect(port)
      local ip, cport = c:getsockname()
      assert.equal("peer " .. ip .. " " .. cport, cmd(c, "peer"))
      local id = cmd(c, "id"):match("^id (.+)$")
      assert.truthy(tonumber(id), "id is not a number: " .. tostring(id))
      assert.is_nil(ids[id], "id " .. id .. " used twice")
      ids[id] = true
      -- env: per connection, across callbacks
      for n = 1, 3 do assert.equal("count " .. n, cmd(c, "count")) end
      c:close()
    end
    assert.equal(0, srv:stop())
  end)

  it("pause() stops on_data until resume()", function()
    local srv, port = start()
    local c = H.connect(port)
    assert.equal("paused", cmd(c, "pause 600"))
    local t0 = H.now()
    H.send(c, "count\n")
    assert.equal("resuming", H.read_line(c, H.T(5)), "on_data ran while paused")
    assert.is_true(H.now() - t0 >= 0.5, "resumed early")
    assert.equal("count 1", H.read_line(c))
    assert.equal("count 2", cmd(c, "count"))
    assert.equal(0, srv:stop())
  end)

  it("close() delivers the queued bytes before closing", function()
    local srv, port = start()
    local n = 8 * 1000 * 1000
    local c = H.connect(port, { rcvbuf = 65536 })
    H.send(c, "bulk " .. n .. "\n")
    local pending = tonumber(srv:wait_stdout("bulk pending (%d+)"))
    assert.is_true(pending > 0, "nothing was queued; the test proves nothing")
    H.sleep(0.3)                                   -- close() happened long ago
    local data, how = H.read_to_eof(c, H.T(10))
    assert.truthy(data, "no EOF: " .. tostring(how))
    assert.equal("closed", how)
    assert.equal(n, #data)
    assert.is_nil(data:find("[^z]"))
    srv:wait_stdout("close nil local", nil, true)
    assert.equal(0, srv:stop())
  end)

  it("mp.args and arg reach the script; require 'cjson' works", function()
    local srv, port = start { "alpha", "beta gamma", "" }
    local script = H.fixture("features.lua")
    srv:wait_stdout("cjson", nil, true)
    local out = srv:stdout()
    assert.truthy(out:find("args " .. port .. "|alpha|beta gamma|\n", 1, true), out)
    assert.truthy(out:find("arg " .. script .. " " .. port .. "|alpha|beta gamma|\n", 1, true), out)
    assert.truthy(out:find('cjson {"list":[1,2,3]}', 1, true), out)
    assert.truthy(out:find("pid " .. srv:pid() .. "\n", 1, true), out)
    local version = out:match("version (%S+)")
    local _, vout = H.run { "--version" }
    assert.truthy(version and vout:find(version, 1, true),
      ("mp.version %s vs --version %s"):format(tostring(version), vout))
    local c = H.connect(port)
    assert.equal("json 42", cmd(c, 'json {"n":21}'))
    assert.equal(0, srv:stop())
  end)
end)
