-- SPDX-License-Identifier: MIT
-- mp.shared's get through LuaJIT's FFI, which compiles the call into the
-- caller's trace (the C API's per-call cost was most of a get's time).
-- Required once per lane by lx_shared_open (src/lx/lx_shared.c), which puts
-- the dictionary methods table, the C get and errmsg_of in core.shared;
-- replaces methods.get by a Lua function that calls moonport_shared_get,
-- and keeps the C get where the FFI can't be had (the module is then
-- false). MOONPORT_SHARED_FFI=0 keeps the C get too.
local core = require("moonport.core").shared
local methods, cget, errmsg_of = core.methods, core.get, core.errmsg_of
if os.getenv("MOONPORT_SHARED_FFI") == "0" then return false end
local ok, ffi = pcall(require, "ffi")
if not ok then return false end
ok = pcall(ffi.cdef, [[
int moonport_shared_get(void *h, const char *k, size_t klen, double *num,
                        const char **s, size_t *len, uint32_t *flags);
]])
local C = ffi.C
local found, fn = pcall(function() return C.moonport_shared_get end)
if not ok or not found then return false end

local num, sp = ffi.new("double[1]"), ffi.new("const char *[1]")
local lenp, fl = ffi.new("size_t[1]"), ffi.new("uint32_t[1]")
local fstr, gmt, type, tostring = ffi.string, getmetatable, type, tostring

methods.get = function(self, k)
  -- Anything but a dictionary and a string or number key goes to the C
  -- get, which raises the usual argument errors.
  if gmt(self) ~= "moonport.shared" then return cget(self, k) end
  local tk = type(k)
  if tk ~= "string" then
    if tk ~= "number" then return cget(self, k) end
    k = tostring(k)
  end
  local t = fn(self, k, #k, num, sp, lenp, fl)
  local v
  if t == 1 then
    v = fstr(sp[0], lenp[0])
  elseif t == 2 then
    v = num[0]
  elseif t == 3 then
    v = num[0] ~= 0
  elseif t == 0 then
    return nil
  else
    return nil, errmsg_of(self, t)
  end
  local f = fl[0]
  if f ~= 0 then return v, f end
  return v
end
return true
