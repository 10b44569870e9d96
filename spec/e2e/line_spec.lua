-- Spec: mp.listen { framing = "line", on_line = fn, max_line = n } through
-- the real binary over raw sockets.
local H = require "spec.helper"

local start, cleanup = H.fixture_servers("line_app.lua")

describe("framing = \"line\"", function()
  after_each(cleanup)
  local srv, port
  before_each(function() srv, port = start() end)

  it("hands on_line each line without its newline, CRLF or LF, however the bytes arrive", function()
    local c = H.connect(port)
    H.send(c, "one\ntwo\r\nthr")
    assert.equal("<one>", H.read_line(c, H.T(5)))
    assert.equal("<two>", H.read_line(c, H.T(5)))
    H.send(c, "ee\n\n")
    assert.equal("<three>", H.read_line(c, H.T(5)))
    assert.equal("<>", H.read_line(c, H.T(5)))
    -- many lines in one write
    local many = {}
    for i = 1, 200 do many[i] = "l" .. i end
    H.send(c, table.concat(many, "\n") .. "\n")
    for i = 1, 200 do assert.equal("<l" .. i .. ">", H.read_line(c, H.T(5))) end
    c:close()
  end)

  it("an on_line that waits holds the lines after it, in order", function()
    local c = H.connect(port)
    H.send(c, "a\nslow\nb\nc\n")
    assert.equal("<a>", H.read_line(c, H.T(5)))
    assert.equal("slept", H.read_line(c, H.T(5)))
    assert.equal("<b>", H.read_line(c, H.T(5)))
    assert.equal("<c>", H.read_line(c, H.T(5)))
    c:close()
  end)

  it("a line past max_line calls on_overflow and closes; a line of exactly max_line is fine", function()
    local c = H.connect(port)
    H.send(c, ("x"):rep(64) .. "\n")
    assert.equal("<" .. ("x"):rep(64) .. ">", H.read_line(c, H.T(5)))
    H.send(c, ("y"):rep(65))
    assert.equal("too long: 65", H.read_line(c, H.T(5)))
    assert.is_nil((H.read_line(c, H.T(5))))
    srv:wait_stdout("\noverflow 65\n", H.T(5), true)
    -- a too-long line that came whole with its newline is refused too
    local d = H.connect(port)
    H.send(d, "ok\n" .. ("z"):rep(100) .. "\nnever\n")
    assert.equal("<ok>", H.read_line(d, H.T(5)))
    assert.equal("too long: 107", H.read_line(d, H.T(5)))
    assert.is_nil((H.read_line(d, H.T(5))))
    -- the server keeps serving
    local e = H.connect(port)
    H.send(e, "still\n")
    assert.equal("<still>", H.read_line(e, H.T(5)))
    e:close()
  end)

  it("a last line without a newline reaches on_line before on_close", function()
    local c = H.connect(port)
    H.send(c, "a\nlast:words")
    assert.equal("<a>", H.read_line(c, H.T(5)))
    c:close()
    srv:wait_stdout("\nclosed ", H.T(5), true)
    local out = srv:stdout()
    local l, cl = out:find("line last:words\n", 1, true), out:find("\nclosed ", 1, true)
    assert.truthy(l, out)
    assert.truthy(cl and l < cl, out)
  end)

  it("refuses bad options with a clear error at the script's line", function()
    local script = H.tmpdir() .. "/bad_line.lua"
    local f = assert(io.open(script, "wb"))
    f:write('local mp = require "moonport"\n',
      'mp.listen { port = 1, framing = "line", on_line = function() end, max_line = 0 }\n')
    f:close()
    local st, _, err = H.run { script }
    assert.equal(1, st)
    assert.truthy(err:find("bad_line.lua:2: mp.listen: max_line must be an integer", 1, true), err)
    f = assert(io.open(script, "wb"))
    f:write('local mp = require "moonport"\n',
      'mp.listen { port = 1, framing = "line", on_data = function() end, on_line = function() end }\n')
    f:close()
    st, _, err = H.run { script }
    assert.equal(1, st)
    assert.truthy(err:find("framing = \"line\" and on_data can't be used together", 1, true), err)
  end)
end)
