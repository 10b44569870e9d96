-- The clients' address controls against SSRF beyond mp.tcp and mp.fetch
-- (spec/fixtures/outbound_app.lua): mp.websocket's deny / allow, checked
-- on the address mp.connect goes to, and mp.http { deny =, allow = } as
-- the lane's default for every client call that gives neither.
local H = require "spec.helper"

local function get(port, path) return H.get_json(port, path, H.T(20)) end

describe("outbound address controls", function()
  local start, cleanup = H.fixture_servers("outbound_app.lua")
  after_each(cleanup)

  it("mp.websocket: deny refuses before any connect (by address and by name), allow is asked, the rest connects", function()
    local _, port = start()
    -- a refused address never reaches the server: on_error / nil, err
    assert.same({ "error address refused: 127.0.0.1 (loopback)" },
                get(port, "/ws?host=127.0.0.1&deny=loopback").events)
    assert.same({ "error address refused: 127.0.0.1 (loopback)" },
                get(port, "/ws?host=127.0.0.1&deny=loopback&wait=1").events)
    -- a name is looked up and its address checked (no second lookup)
    assert.same({ "error address refused: 127.0.0.1 (127.0.0.0/8)" },
                get(port, "/ws?host=localhost&deny=10.0.0.0/8,127.0.0.0/8").events)
    assert.same({ "called 127.0.0.1", "error address refused: 127.0.0.1 (allow said no)" },
                get(port, "/ws?host=127.0.0.1&no=1").events)
    assert.equal(0, get(port, "/upgrades").n)
    -- a list that lets it through connects
    assert.same({ "open" }, get(port, "/ws?host=localhost&deny=private,link-local").events)
    assert.same({ "open" }, get(port, "/ws?host=127.0.0.1&deny=private&wait=1").events)
    assert.equal(2, get(port, "/upgrades").n)
  end)

  it("mp.http { deny = } is the default of mp.websocket, mp.fetch and mp.tcp; a call's own list (or deny = false) wins", function()
    local _, port = start({ "loopback" })
    local refused = "address refused: 127.0.0.1 (loopback)"
    assert.same({ "error " .. refused }, get(port, "/ws?host=127.0.0.1").events)
    assert.same({ "error " .. refused }, get(port, "/ws?host=localhost&wait=1").events)
    assert.equal(refused, get(port, "/fetch?host=127.0.0.1").err)
    assert.equal(refused, get(port, "/fetch?host=localhost").err)
    assert.equal(refused, get(port, "/tcp?host=localhost").err)
    assert.equal(0, get(port, "/upgrades").n)
    -- the call's own deny replaces the default; false turns it off
    assert.same({ "open" }, get(port, "/ws?host=127.0.0.1&deny=private").events)
    assert.same({ "open" }, get(port, "/ws?host=localhost&deny=false").events)
    assert.equal(200, get(port, "/fetch?host=127.0.0.1&deny=false").status)
    assert.is_true(get(port, "/tcp?host=127.0.0.1&deny=private").ok)
    -- the server itself still answers loopback clients
    assert.equal(2, get(port, "/upgrades").n)
  end)
end)
