-- The parts of the `moonport` module (mp) written in Lua; luaopen_moonport
-- (src/lx/lx_moonport.c) calls this with the table it built in C.
local json = require("moonport.json")
local router = require("moonport.router")
local line = require("moonport.line")
local serve = require("moonport.serve")

return function(mp)
  mp.json = json
  mp.router = router.new
  -- framing = "line": lua/moonport/line.lua over on_data
  local listen, connect = mp.listen, mp.connect
  mp.listen = function(opts, ...)
    if type(opts) == "table" and opts.framing ~= nil then opts = line.wrap(opts, "mp.listen") end
    if type(opts) == "table" and opts.on_connect ~= nil then opts = serve.wrap(opts) end
    return listen(opts, ...)
  end
  mp.connect = function(opts, ...)
    if type(opts) == "table" and opts.framing ~= nil then opts = line.wrap(opts, "mp.connect") end
    return connect(opts, ...)
  end
  return mp
end
