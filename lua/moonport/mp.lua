-- The parts of the `moonport` module (mp) written in Lua; luaopen_moonport
-- (src/lx/lx_moonport.c) calls this with the table it built in C.
local json = require("moonport.json")
local router = require("moonport.router")

return function(mp)
  mp.json = json
  mp.router = router.new
  return mp
end
