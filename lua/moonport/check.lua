-- SPDX-License-Identifier: MIT
-- moonport --check: after the script's top level ran in a throw-away lane
-- (src/lx/lx_check.c), the globals its functions read that nothing
-- defines, found in LuaJIT's bytecode (each GGET's name and line), the
-- way luacheck finds them in the source, in the script and in the
-- modules it requires from its own folder. Defined: what _G holds now
-- (the libraries, and what the top level set) and every name any
-- function of these files assigns as a global. Returns the warnings,
-- "file:line: ..." strings in file and line order, and the modules
-- checked.
local ok_util, jutil = pcall(require, "jit.util")
local ok_vm, vmdef = pcall(require, "jit.vmdef")
local band, rshift = bit.band, bit.rshift
local funcinfo, funcbc, funck = jutil.funcinfo, jutil.funcbc, jutil.funck

local function opname(op)
  return vmdef.bcnames:sub(op * 6 + 1, op * 6 + 6):gsub(" +$", "")
end

-- Calls fn(name, op, line) for each GGET and GSET of `proto` and of the
-- functions inside it, and req(name) for each require "name" with a
-- constant name (GGET require, then KSTR into its first argument).
local function walk(proto, fn, req)
  local req_reg -- the register a GGET of require just filled
  for pc = 1, 1e9 do
    local ins = funcbc(proto, pc)
    if not ins then break end
    local op = opname(band(ins, 0xff))
    local a, d = band(rshift(ins, 8), 0xff), rshift(ins, 16)
    -- the first argument's slot: A + 1, or A + 2 with two-slot frames (x64)
    if op == "KSTR" and req_reg and (a == req_reg + 1 or a == req_reg + 2) then
      req(funck(proto, -d - 1))
    end
    req_reg = nil
    if op == "GGET" or op == "GSET" then
      local name = funck(proto, -d - 1)
      fn(name, op, funcinfo(proto, pc).currentline)
      if op == "GGET" and name == "require" then req_reg = a end
    end
  end
  for i = -1, -1e9, -1 do
    local k = funck(proto, i)
    if k == nil then break end
    if type(k) == "proto" then walk(k, fn, req) end
  end
end

-- The file of module `name` in the script's own folder (dir/name.lua or
-- dir/name/init.lua, dots as slashes), or nil: the modules of the app,
-- not the libraries it uses nor moonport's own (package.preload).
local function own_file(name, dir)
  if type(name) ~= "string" or package.preload[name] then return nil end
  return package.searchpath(name, dir .. "/?.lua;" .. dir .. "/?/init.lua")
end

-- check(script): the warnings, then the modules checked besides the
-- script (their paths under its folder). The script's modules are those
-- it (or a module of it) requires from its own folder, at the top level
-- (in package.loaded by now) or with a constant name anywhere in its
-- functions (which may run only later); they are checked as the script
-- is, with the globals any of them sets counted as defined.
return function(script)
  if not (ok_util and ok_vm) then error("jit.util is not available: no check", 0) end
  local dir = require("moonport").script_dir or (script:match("^(.*)/[^/]*$") or ".")
  local set, reads, out = {}, {}, {}
  local files, queued = {}, {}
  local function add(path, label)
    if queued[path] then return end
    queued[path] = true
    files[#files + 1] = { path = path, label = label }
  end
  local function add_module(name)
    local path = own_file(name, dir)
    if path then add(path, path:sub(#dir + 2)) end
  end
  add(script, script:match("[^/]*$"))
  for name in pairs(package.loaded) do add_module(name) end
  local i = 0
  while i < #files do
    i = i + 1
    local f = files[i]
    local chunk, err = loadfile(f.path)
    if not chunk then
      if i == 1 then error(err, 0) end
      out[#out + 1] = { text = f.label .. ": does not load: " .. tostring(err), file = i, line = 0 }
    else
      walk(chunk, function(name, op, line)
        if op == "GSET" then set[name] = true
        else reads[#reads + 1] = { name = name, line = line, file = i } end
      end, add_module)
    end
  end
  table.sort(reads, function(a, b)
    if a.file ~= b.file then return a.file < b.file end
    if a.line ~= b.line then return a.line < b.line end
    return a.name < b.name
  end)
  local seen = {}
  for _, r in ipairs(reads) do
    local key = r.file .. ":" .. r.name .. ":" .. r.line
    if rawget(_G, r.name) == nil and not set[r.name] and not seen[key] then
      seen[key] = true
      out[#out + 1] = { file = r.file, line = r.line,
        text = ("%s:%d: undefined global '%s' (nothing in the script or the libraries defines it)")
          :format(files[r.file].label, r.line, r.name) }
    end
  end
  table.sort(out, function(a, b)
    if a.file ~= b.file then return a.file < b.file end
    return a.line < b.line
  end)
  local lines, mods = {}, {}
  for k, w in ipairs(out) do lines[k] = w.text end
  for k = 2, #files do mods[#mods + 1] = files[k].label end
  table.sort(mods)
  return lines, mods
end
