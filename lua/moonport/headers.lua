-- SPDX-License-Identifier: MIT
-- The metatable of req.headers: names are stored in lower case, and a
-- look-up in any case finds them (req.headers["Content-Type"]).
local rawget, type = rawget, type

return {
  __index = function(h, k)
    if type(k) ~= "string" then return nil end
    local l = k:lower()
    if l ~= k then return rawget(h, l) end
  end,
}
