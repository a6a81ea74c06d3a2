// Package slurmconf writes what every Slurm this project starts shares —
// the end-to-end tests' cluster of test hosts and pmibench's one-node
// peer: the settings that depend neither on the hosts nor on where the
// daemons keep their files, and the cgroup configuration that keeps
// slurmd out of the machine's cgroups.
package slurmconf

// Fixed are slurm.conf lines independent of hosts and paths: root runs
// every daemon, munge authenticates, ranks are tracked as plain processes,
// no task, switch, accounting or job-completion plugin, linear selection,
// and a node that was down returns to service by itself.
var Fixed = []string{
	"SlurmUser=root",
	"SlurmdUser=root",
	"AuthType=auth/munge",
	"CredType=cred/munge",
	"ProctrackType=proctrack/linuxproc",
	"TaskPlugin=task/none",
	"MpiDefault=none",
	"SwitchType=switch/none",
	"SchedulerType=sched/builtin",
	"SelectType=select/linear",
	"ReturnToService=2",
	"JobAcctGatherType=jobacct_gather/none",
	"AccountingStorageType=accounting_storage/none",
	"JobCompType=jobcomp/none",
	"MailProg=/bin/true",
}

// Cgroup is cgroup.conf with no cgroups in use: slurmd 22.05 always loads
// a cgroup plugin; this one gets an empty directory, mountpoint, of its
// own and never uses it.
func Cgroup(mountpoint string) string {
	return "CgroupPlugin=cgroup/v1\nCgroupMountpoint=" + mountpoint + "\nCgroupAutomount=no\n"
}
