// SPDX-License-Identifier: GPL-2.0
/*
 * rdmalab_warn: a test aid for rdmalab's kernel-log oracle. Loading it makes the kernel
 * log one WARNING splat (a "WARNING: CPU: ..." line, a call trace, "---[ end trace ... ]---"),
 * as a driver bug would; nothing else happens. The load succeeds, so the module can be
 * removed and loaded again: each load is one more splat. Built out of tree like siw.ko
 * (bindings/rdmalab/machines/vmlab/kernel.py); never loaded by anything but tests/kernlog.
 */
#include <linux/bug.h>
#include <linux/init.h>
#include <linux/module.h>

static int __init rdmalab_warn_init(void)
{
	WARN(1, "rdmalab_warn: a deliberate warning for rdmalab's kernel-log oracle\n");
	return 0;
}

static void __exit rdmalab_warn_exit(void)
{
}

module_init(rdmalab_warn_init);
module_exit(rdmalab_warn_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("rdmalab test aid: one WARN splat on load");
