-- Spec: WebSocket permessage-deflate (RFC 7692), websocket = { compress },
-- against the real binary with the npm ws client (its perMessageDeflate:
-- context takeover on and off, window bits) and raw sockets whose frames
-- node's zlib makes (a deflate bomb, RSV1 where it may not be, fragments).
-- The application is spec/fixtures/ws_deflate_app.lua; the client side is
-- spec/node/ws_deflate_cases.js.
local H = require "spec.helper"
local JS = require "spec.js"
local cjson = require "cjson"

local start, cleanup = H.fixture_servers("ws_deflate_app.lua")
local ONE = { workers = 1, threads = 1 }

local function case(srv, port, name, ...)
  return JS.run("ws_deflate_cases.js", { port, name, ... }, 120, srv)
end

-- Peak RSS (KiB) of a server's processes, summed.
local function hwm(srv)
  local kb = 0
  local pids = H.children(srv:pid())
  pids[#pids + 1] = srv:pid()
  for _, pid in ipairs(pids) do
    local s = H.read_file("/proc/" .. pid .. "/status")
    kb = kb + (tonumber(s and s:match("VmHWM:%s*(%d+)")) or 0)
  end
  return kb
end

describe("WebSocket permessage-deflate:", function()
  setup(function()
    local why = JS.missing()
    assert(not why, why)
  end)
  after_each(cleanup)

  it("npm ws with perMessageDeflate: agreed without server context takeover, messages over the threshold deflated, echoes intact; without it, plain", function()
    local srv, port = start({ "on" }, ONE)
    local r = case(srv, port, "negotiate", "true", "false",
      cjson.encode { serverNoContextTakeover = false, clientNoContextTakeover = true })
    assert.equal("permessage-deflate; server_no_context_takeover", r[1].answer)
    assert.is_true(r[1].same)
    assert.equal(3, r[1].deflates, "6000, 3000 and 6000 bytes; not the 4-byte one")
    assert.truthy(r[1].deflate_out < r[1].deflate_in / 5, cjson.encode(r[1]))
    assert.equal(cjson.null, r[2].answer)
    assert.is_true(r[2].same)
    assert.equal(0, r[2].deflates)
    assert.equal("permessage-deflate; server_no_context_takeover; client_no_context_takeover", r[3].answer)
    assert.is_true(r[3].same)
  end)

  it("context takeover both ways when configured: each side keeps its stream, the repeated message costs less", function()
    local srv, port = start({ "ctx" }, ONE)
    local r = case(srv, port, "negotiate",
      cjson.encode { serverNoContextTakeover = false, clientNoContextTakeover = false })
    assert.equal("permessage-deflate", r[1].answer)
    assert.is_true(r[1].same)
    assert.equal(3, r[1].deflates)
    -- the same message without context, for comparison
    local srv2, port2 = start({ "on" }, ONE)
    local alone = case(srv2, port2, "negotiate", "true")[1]
    assert.truthy(r[1].deflate_out < alone.deflate_out,
      ("with context %d bytes, without %d"):format(r[1].deflate_out, alone.deflate_out))
  end)

  it("window bits: the server's limit and the client's, the smaller of what each side asks", function()
    local srv, port = start({ "bits" }, ONE)
    local r = case(srv, port, "negotiate", "true",
      cjson.encode { serverMaxWindowBits = 9, clientMaxWindowBits = 10 })
    assert.equal("permessage-deflate; server_no_context_takeover; server_max_window_bits=10; client_max_window_bits=11", r[1].answer)
    assert.equal("permessage-deflate; server_no_context_takeover; server_max_window_bits=9; client_max_window_bits=10", r[2].answer)
    for _, x in ipairs(r) do assert.is_true(x.same) end
  end)

  it("negotiation: the first acceptable offer; unknown, repeated or bad parameters and an 8-bit server window are declined (the upgrade still succeeds)", function()
    local srv, port = start({ "on" }, ONE)
    local r = case(srv, port, "offers",
      "permessage-deflate; server_max_window_bits=8",
      "permessage-deflate; server_max_window_bits=8, permessage-deflate",
      "x-webkit-deflate-frame, permessage-deflate; client_max_window_bits",
      "permessage-deflate; foo=1",
      "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
      'permessage-deflate; client_max_window_bits="12"',
      "permessage-deflate; client_max_window_bits=16",
      "permessage-deflate; server_no_context_takeover=1")
    local want = { cjson.null, "permessage-deflate; server_no_context_takeover",
                   "permessage-deflate; server_no_context_takeover",
                   cjson.null, cjson.null,
                   "permessage-deflate; server_no_context_takeover; client_max_window_bits=12",
                   cjson.null, cjson.null }
    for i, row in ipairs(r) do
      assert.equal(101, row.status, row.offer)
      assert.equal(want[i], row.answer, row.offer)
    end
    assert.equal(#want, #r)
  end)

  it("a compressed message in three fragments (RSV1 on the first) is inflated whole; the echo goes out deflated", function()
    local srv, port = start({ "on" }, ONE)
    local r = case(srv, port, "fragments")[1]
    assert.is_true(r.rsv1)
    assert.equal(1, r.opcode)
    assert.is_true(r.same)
    assert.truthy(r.wire < 1000, r.wire)
  end)

  it("protocol errors: RSV1 on a control frame or a continuation, or without the extension: 1002; bad deflate data or bad UTF-8 inside: 1007", function()
    local srv, port = start({ "on" }, ONE)
    for what, code in pairs { ping = 1002, cont = 1002, nooffer = 1002, garbage = 1007, badtext = 1007 } do
      local r = case(srv, port, "bad", what)[1]
      assert.equal(code, r.code, what)
    end
    assert.truthy(srv:alive())
  end)

  it("a deflate bomb (200 MiB of zeros in a 200 KB frame) is closed with 1009 after at most max_msg of output; the server's peak memory barely moves", function()
    local srv, port = start({ "on" }, ONE)
    case(srv, port, "negotiate", "true") -- warm up: the lane's streams exist
    local before = hwm(srv)
    local r = case(srv, port, "bad", "bomb", 200)
    assert.equal(1009, r[2].code)
    local grew = hwm(srv) - before
    assert.truthy(grew < 16 * 1024, ("peak RSS grew %d KiB"):format(grew))
    assert.truthy(srv:alive())
  end)

  it("pub/sub fan-out: 1,000 compressed subscribers, each message deflated once (the deflate count equals the messages), every delivery intact", function()
    local srv, port = start({ "on" }, ONE)
    local n = H.scale > 1 and 300 or 1000
    local r = case(srv, port, "fanout", "fan", n, 20, 1024)[1]
    assert.equal(n, r.compressed)
    assert.equal(0, r.bad)
    assert.equal(20, r.deflates, cjson.encode(r))
    assert.equal(20 * n, r.delivered)
    assert.truthy(r.deflate_out < r.deflate_in / 2, cjson.encode(r))
  end)

  it("pub/sub with server context takeover: each subscriber's own stream deflates its copy", function()
    local srv, port = start({ "ctx" }, ONE)
    local r = case(srv, port, "fanout", "fanctx", 20, 3, 1024,
      cjson.encode { serverNoContextTakeover = false, clientNoContextTakeover = false })[1]
    assert.equal(0, r.bad)
    assert.equal(60, r.deflates)
  end)

  it("mp.websocket { compress } against npm ws's server: offered, agreed, its frames deflated (RSV1 on the wire), echoes intact; with context takeover too", function()
    for _, takeover in ipairs { "", "takeover" } do
      local node = H.spawn({ JS.node, JS.dir .. "/ws_deflate_server.js", takeover })
      local nport = cjson.decode(node:wait_stdout("{[^\n]*}", H.T(10))).port
      local port = H.free_port()
      H.start("ws_deflate_client.lua", { args = { port }, wait_port = port, threads = 1 })
      local function run(mode)
        local st, out = H.exec({ "/usr/bin/curl", "-sS", "--max-time", tostring(H.T(30)),
          ("http://127.0.0.1:%d/run?port=%d&mode=%s"):format(port, nport, mode) })
        assert.equal(0, st)
        return cjson.decode(out)
      end
      -- (a ws server that keeps its context refuses the handshake when
      -- asked for server_no_context_takeover: the table only without it)
      local on, off = run("on"), run("off")
      local tbl = takeover == "" and run("table") or nil
      assert.same({ compressed = true, same = true, n = 4 }, on, takeover)
      assert.same({ compressed = false, same = true, n = 4 }, off, takeover)
      local _, sout = H.exec({ "/usr/bin/curl", "-sS", ("http://127.0.0.1:%d/stats"):format(nport) })
      local st = cjson.decode(sout)
      assert.equal("permessage-deflate; client_max_window_bits", st.offers[1])
      assert.equal(cjson.null, st.offers[2])
      assert.truthy(st.answers[1]:find("^permessage%-deflate"), st.answers[1])
      if tbl then
        assert.same({ compressed = true, same = true, n = 4 }, tbl)
        assert.equal("permessage-deflate; server_no_context_takeover; client_no_context_takeover; " ..
          "server_max_window_bits=10; client_max_window_bits", st.offers[3])
        -- 3 messages over the default threshold, then 4 with threshold 0
        assert.equal(7, st.rsv1, sout)
      else
        assert.equal(3, st.rsv1, sout)
      end
      node:kill(H.SIGKILL)
      node:wait_exit(5)
      H.cleanup()
    end
  end)
end)
