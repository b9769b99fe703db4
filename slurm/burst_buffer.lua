--[[
Spillway for Slurm's burst_buffer/lua plugin (Slurm 22.05, Lua 5.1).

Install: copy this file next to slurm.conf as burst_buffer.lua, set
    BurstBufferType=burst_buffer/lua
in slurm.conf and use the example burst_buffer.conf (Directive=DW) shipped beside this
file. Every function runs Spillway's dw_wlm_cli, the same program the
burst_buffer/datawarp plugin runs, so both plugins drive one lifecycle (README,
"Slurm"): setup, data_in, real_size, paths, pre_run, post_run, data_out, teardown.

Slurm reloads this file on every call and keeps no state in it; neither does
dw_wlm_cli (it finds the job again from its id). Three functions (job_process, pools,
paths) run inside slurmctld with no timeout: dw_wlm_cli answers them from the
manager's database without waiting on storage.

What the lua plugin itself does differently (spec §2): #BB lines are not directives
with Directive=DW, so persistent instances are created with dwcli, not from job
scripts; a capacity= needs a pool=.
--]]

-- Where Spillway's tools are. Sites edit these two lines.
local DW_WLM_CLI = "/usr/local/bin/dw_wlm_cli"
local DWSTAT = "/usr/local/bin/dwstat"

-- A word for /bin/sh, quoted so that nothing in it is interpreted.
local function quote(s)
	return "'" .. string.gsub(tostring(s), "'", "'\\''") .. "'"
end

-- Run a program with arguments; returns its exit status and its output (stdout and
-- stderr). Lua 5.1's popen cannot tell the exit status, so the shell prints it last.
local function run(prog, args)
	local words = { quote(prog) }
	for _, a in ipairs(args) do
		table.insert(words, quote(a))
	end
	local cmd = table.concat(words, " ") .. " </dev/null 2>&1; echo \"__spillway_rc=$?\""
	local p = io.popen(cmd)
	if p == nil then
		return 127, "cannot run " .. prog
	end
	local out = p:read("*a") or ""
	p:close()
	local rc = 127
	out = string.gsub(out, "__spillway_rc=(%d+)\n?$", function(n)
		rc = tonumber(n)
		return ""
	end)
	out = string.gsub(out, "\n+$", "")
	return rc, out
end

local function wlm(args)
	local rc, out = run(DW_WLM_CLI, args)
	if rc == 0 then
		return slurm.SUCCESS, out
	end
	slurm.log_error("spillway: dw_wlm_cli %s: exit %d: %s", args[2], rc, out)
	return slurm.ERROR, out
end

function slurm_bb_job_process(job_script)
	return wlm({ "--function", "job_process", "--job", job_script })
end

function slurm_bb_pools()
	return wlm({ "--function", "pools" })
end

function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script)
	-- pool is the string "(null)" when the job named none: the site's default pool.
	local capacity = bb_size
	if pool ~= nil and pool ~= "(null)" and pool ~= "" then
		capacity = pool .. ":" .. bb_size
	end
	return wlm({
		"--function", "setup", "--token", job_id, "--caller", "SLURM",
		"--user", uid, "--groupid", gid, "--capacity", capacity, "--job", job_script,
	})
end

function slurm_bb_data_in(job_id, job_script)
	return wlm({ "--function", "data_in", "--token", job_id, "--job", job_script })
end

function slurm_bb_real_size(job_id)
	local rc, out = wlm({ "--function", "real_size", "--token", job_id })
	if rc ~= slurm.SUCCESS then
		return rc, out
	end
	local bytes = string.match(out, '"capacity":(%d+)')
	if bytes == nil then
		return slurm.ERROR, "unexpected real_size answer: " .. out
	end
	return slurm.SUCCESS, bytes
end

function slurm_bb_paths(job_id, job_script, path_file)
	return wlm({
		"--function", "paths", "--job", job_script, "--token", job_id, "--pathfile", path_file,
	})
end

-- The 22.05 lua plugin does not pass the job's nodes: ask Slurm, one host per line.
local function node_file(job_id)
	local rc, list = run("squeue", { "-h", "-j", job_id, "-o", "%N" })
	if rc ~= 0 or list == "" then
		return nil, "cannot learn the nodes of job " .. job_id .. ": " .. list
	end
	local rc2, hosts = run("scontrol", { "show", "hostnames", list })
	if rc2 ~= 0 then
		return nil, "scontrol show hostnames " .. list .. ": " .. hosts
	end
	local name = os.tmpname()
	local f = io.open(name, "w")
	if f == nil then
		return nil, "cannot write " .. name
	end
	f:write(hosts .. "\n")
	f:close()
	return name, nil
end

function slurm_bb_pre_run(job_id, job_script)
	local file, err = node_file(job_id)
	if file == nil then
		slurm.log_error("spillway: pre_run: %s", err)
		return slurm.ERROR, err
	end
	local rc, out = wlm({
		"--function", "pre_run", "--token", job_id, "--job", job_script,
		"--nodehostnamefile", file,
	})
	os.remove(file)
	return rc, out
end

function slurm_bb_post_run(job_id, job_script)
	return wlm({ "--function", "post_run", "--token", job_id, "--job", job_script })
end

function slurm_bb_data_out(job_id, job_script)
	return wlm({ "--function", "data_out", "--token", job_id, "--job", job_script })
end

function slurm_bb_job_teardown(job_id, job_script, hurry)
	local args = { "--function", "teardown", "--token", job_id, "--job", job_script }
	if hurry == "true" then
		table.insert(args, "--hurry")
	end
	return wlm(args)
end

-- scontrol show bbstat [args...]: dwstat with those arguments.
function slurm_bb_get_status(...)
	local rc, out = run(DWSTAT, { ... })
	if rc ~= 0 then
		return slurm.ERROR, out
	end
	return slurm.SUCCESS, out
end
