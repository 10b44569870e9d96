-- Spec 8: errors before serving give one "moonport: " line on stderr, a
-- non-zero status (1, or 2 for usage errors) and nothing listening;
-- --help and --version exit 0.
local H = require "spec.helper"
local socket = require "socket"

local one_line = H.one_line

local function plain(hay, needle)
  return hay:find(needle, 1, true) ~= nil
end

describe("startup errors", function()
  after_each(H.cleanup)

  it("missing script file", function()
    local script = H.fixture("does-not-exist.lua")
    local st, _, err = H.run { script }
    assert.equal(1, st)
    local l = one_line(err)
    assert.is_true(plain(l, "does-not-exist.lua"), l)
  end)

  it("script with a syntax error", function()
    local st, _, err = H.run { H.fixture("syntax_error.lua") }
    assert.equal(1, st)
    local l = one_line(err)
    assert.is_true(plain(l, "syntax_error.lua"), l)
    assert.is_true(plain(l, ":3:"), "no line number in: " .. l)
  end)

  it("error at top level releases the port it listened on", function()
    local port = H.free_port()
    local st, _, err = H.run { H.fixture("top_error.lua"), port }
    assert.equal(1, st)
    local l = one_line(err)
    assert.is_true(plain(l, "top_error.lua"), l)
    assert.is_true(plain(l, "top level failure"), l)
    assert.is_false(H.is_listening(port))
  end)

  it("unknown option", function()
    local st, _, err = H.run { "--bogus-option", H.fixture("echo.lua"), H.free_port() }
    assert.equal(2, st)
    local l = one_line(err)
    assert.is_true(plain(l, "bogus-option"), l)
  end)

  it("bad option value", function()
    for _, args in ipairs { { "-t", "abc" }, { "--threads", "abc" }, { "-g", "soon" } } do
      local port = H.free_port()
      local st, _, err = H.run { args[1], args[2], H.fixture("echo.lua"), port }
      assert.equal(2, st, table.concat(args, " ") .. ": " .. err)
      local l = one_line(err)
      assert.is_true(plain(l, args[2]) or plain(l, args[1]), l)
      assert.is_false(H.is_listening(port))
    end
  end)

  it("no script at all is a usage error", function()
    local st, _, err = H.run {}
    assert.equal(2, st)
    one_line(err)
  end)

  it("port already in use", function()
    local port = H.free_port()
    local holder = assert(socket.bind("0.0.0.0", port))
    local st, _, err = H.run { H.fixture("echo.lua"), port }
    assert.equal(1, st)
    local l = one_line(err)
    assert.is_true(plain(l, tostring(port)), "port not named in: " .. l)
    -- the listener left is the spec's own
    assert.equal(1, #H.listening_inodes(port))
    holder:close()
    assert.is_false(H.is_listening(port))
  end)

  it("Unix socket path that cannot be bound", function()
    local path = H.tmpdir() .. "/no/such/dir/s.sock"
    local st, _, err = H.run { H.fixture("echo.lua"), path }
    assert.equal(1, st)
    local l = one_line(err)
    assert.is_true(plain(l, path), "path not named in: " .. l)
    assert.is_false(H.exists(path))
  end)

  it("--help and --version exit 0", function()
    for _, opt in ipairs { "--help", "-h" } do
      local st, out, err = H.run { opt }
      assert.equal(0, st, opt .. ": " .. err)
      assert.truthy(out:lower():find("usage", 1, true), opt .. " printed: " .. out)
      assert.truthy(out:find("--threads", 1, true), opt .. " does not list --threads")
    end
    for _, opt in ipairs { "--version", "-V" } do
      local st, out, err = H.run { opt }
      assert.equal(0, st, opt .. ": " .. err)
      assert.matches("^moonport %d+%.%d+%.%d+", out)
    end
  end)
end)
