-- Spec 3: mp.connect to local listeners (its own TCP and Unix listeners, and
-- a luasocket server run by the spec); on_fail on a closed port.
local H = require "spec.helper"
local socket = require "socket"

describe("mp.connect", function()
  after_each(H.cleanup)

  it("exchanges data with local listeners and reports failures with on_fail", function()
    local port, closed = H.free_port(), H.free_port()
    local spec_server = assert(socket.bind("127.0.0.1", 0))
    local _, spec_port = spec_server:getsockname()
    local path = H.tmpdir() .. "/c.sock"
    local srv = H.start("connect.lua", {
      args = { port, closed, spec_port, path }, wait_port = port,
    })

    -- the fixture connects to the spec's server and says "hi spec"
    spec_server:settimeout(H.T(5))
    local peer = assert(spec_server:accept())
    peer:settimeout(H.T(5))
    assert.equal("hi spec", H.read_line(peer))
    assert.is_true(H.send(peer, "hi moonport\n"))
    srv:wait_stdout("spec got hi moonport", nil, true)
    peer:close()
    srv:wait_stdout("spec close peer", nil, true)

    -- to itself over TCP: data written before the connection opened arrives
    srv:wait_stdout("self got echo:hello", nil, true)
    srv:wait_stdout("self close local", nil, true)
    assert.truthy(srv:stdout():find("self open\n", 1, true))
    -- over its own Unix listener
    srv:wait_stdout("unix got unix:hi", nil, true)

    -- the closed port: on_fail with a message, never on_open / on_close
    local msg = srv:wait_stdout("refused fail ([^\n]*)\n")
    assert.matches("refused", msg)
    H.sleep(0.3)
    local out = srv:stdout()
    assert.is_nil(out:find("refused open", 1, true), out)
    assert.is_nil(out:find("refused close", 1, true), out)
    assert.is_nil(out:find("self fail", 1, true), out)
    assert.is_nil(out:find("spec fail", 1, true), out)

    spec_server:close()
    assert.equal(0, srv:stop())
  end)
end)
