-- Spec: `make install` / `make uninstall` into a temporary DESTDIR: the
-- binary (the one under test, through INSTALL_BIN), the man page, the docs
-- and the examples; the installed binary serves an installed example.
local H = require "spec.helper"

local function sh(cmd)
  local out = os.tmpname()
  local ok, _, code = os.execute(cmd .. " >" .. out .. " 2>&1")
  local text = H.read_file(out) or ""
  os.remove(out)
  -- LuaJIT's os.execute returns the raw status unless built with 5.2 compat
  if type(ok) == "number" then return ok == 0, text end
  return ok == true and code == 0, text
end

describe("make install", function()
  after_each(H.cleanup)

  it("puts the binary, moonport.1, the docs and the examples under DESTDIR/PREFIX; the installed binary serves; make uninstall removes them", function()
    local dest = H.tmpdir()
    local args = ("-s -C %s PREFIX=/usr/local DESTDIR=%s INSTALL_BIN=%s"):format(H.root, dest, H.bin)
    local ok, out = sh("make " .. args .. " install")
    assert.is_true(ok, out)
    local prefix = dest .. "/usr/local"
    local files = {
      "bin/moonport", "share/man/man1/moonport.1",
      "share/doc/moonport/README.md", "share/doc/moonport/API.md", "share/doc/moonport/ARCHITECTURE.md",
      "share/doc/moonport/examples/echo.lua", "share/doc/moonport/examples/chat.lua",
      "share/doc/moonport/examples/chat/index.html",
      "share/doc/moonport/contrib/moonport.service", "share/doc/moonport/contrib/moonport.logrotate",
    }
    for _, f in ipairs(files) do assert.is_true(H.exists(prefix .. "/" .. f), f) end
    assert.equal(H.read_file(H.bin), H.read_file(prefix .. "/bin/moonport"))

    -- the man page is valid roff and names every option of --help
    ok, out = sh("groff -man -Tutf8 -ww -P-cbou " .. prefix .. "/share/man/man1/moonport.1")
    assert.is_true(ok, out)
    assert.equal("", (out:gsub("[^\n]*\n", function(l) return l:find("warning", 1, true) and l or "" end)))
    local _, help = H.run({ "--help" })
    local man = out:gsub("\226\128\144", "-") -- groff's hyphen
    for opt in help:gmatch("%-%-[%w%-]+") do
      if opt ~= "--" then assert.truthy(man:find(opt, 1, true), opt .. " is not in moonport.1") end
    end

    -- the installed binary on the installed echo example
    local port = H.free_port()
    local srv = H.spawn({ prefix .. "/bin/moonport", "-w", "1",
      prefix .. "/share/doc/moonport/examples/echo.lua", tostring(port) })
    H.wait_for(function() return srv:listens_on(port) or not srv:alive() end, H.T(10),
      function() return srv:describe() end)
    assert.is_true(srv:alive(), srv:describe())
    local c = H.connect(port)
    assert.is_true(H.send(c, "installed\n"))
    assert.equal("installed\n", H.read_exact(c, 10))
    c:close()
    assert.equal(0, srv:stop())

    ok, out = sh("make " .. args .. " uninstall")
    assert.is_true(ok, out)
    for _, f in ipairs(files) do assert.is_false(H.exists(prefix .. "/" .. f), f) end
  end)
end)
