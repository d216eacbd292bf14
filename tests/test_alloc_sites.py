"""Which frame of a sampled block's stack is its site (``recovery.allocs.site_and_imports``), pure."""

from __future__ import annotations

from blackbox.recovery.allocs import site_and_imports

JOB = "train_step (/home/u/train.py:41)"
LIBRARY = "forward (/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py:125)"
STDLIB = "copy (/usr/lib/python3.11/copy.py:92)"
IMPORT = "_call_with_frames_removed (<frozen importlib._bootstrap>:241)"
SITE = "execsitecustomize (<frozen site>:566)"
BOOT = "_chain (/tmp/runs/run-1/.boot/sitecustomize.py:24)"
ARM = "arm (/venv/lib/python3.11/site-packages/blackbox/_api.py:88)"


def test_the_innermost_frame_of_the_jobs_own_code_is_the_site() -> None:
    assert site_and_imports(";".join(["<module> (/home/u/train.py:9)", JOB, LIBRARY, STDLIB])) == (JOB, False)


def test_a_library_line_is_the_site_where_no_frame_is_the_jobs_and_imports_are_told() -> None:
    assert site_and_imports(";".join([IMPORT, LIBRARY, STDLIB])) == (LIBRARY, True)


def test_blackbox_runs_own_start_up_is_never_the_site_of_a_stack_of_the_standard_library_and_blackbox() -> None:
    # ci60: `saved = list(sys.path)` in the sitecustomize `blackbox run` writes, sampled, was named a site
    assert site_and_imports(";".join([SITE, BOOT]))[0] == SITE
    assert site_and_imports(";".join([SITE, BOOT, ARM]))[0] == SITE
    assert site_and_imports(";".join([BOOT, ARM]))[0] == ARM  # only blackbox's frames: the innermost still


def test_code_a_library_compiled_from_a_string_is_the_librarys_and_python_c_is_the_jobs() -> None:
    made = "__create_fn__.<locals>.__init__ (<string>:25)"  # a dataclass's __init__, made by dataclasses
    assert site_and_imports(";".join([JOB, LIBRARY, made]))[0] == JOB
    assert site_and_imports(";".join([LIBRARY, made]))[0] == LIBRARY
    assert site_and_imports(";".join(["<module> (<string>:1)", STDLIB]))[0] == "<module> (<string>:1)"  # python -c
    assert site_and_imports(";".join([JOB, made]))[0] == made  # the job's own exec


def test_a_function_cloudpickle_shipped_by_value_is_the_jobs() -> None:
    # (submitit, Ray, Dask: cloudpickle names such code `<dynamic-code>`; the site and the raise were submitit's)
    runner = "DelayedSubmission.result (/venv/lib/python3.11/site-packages/submitit/core/utils.py:137)"
    work = "work (<dynamic-code>:13)"
    assert site_and_imports(";".join([runner, work, LIBRARY]))[0] == work
    assert site_and_imports(";".join([JOB, runner, work]))[0] == work


def test_an_entry_point_script_a_package_installs_is_the_librarys() -> None:
    torchrun = "<module> (/venv/bin/torchrun:6)"
    assert site_and_imports(";".join([torchrun, "main (/venv/lib/python3.11/site-packages/torch/distributed/run.py:9)"
                                      ]))[0].startswith("main (")  # fmt: skip
    assert site_and_imports(";".join([torchrun, JOB]))[0] == JOB


def test_a_jobs_own_script_without_an_extension_in_a_bin_folder_is_the_jobs() -> None:
    # (a red team's `bin/train`: every frame of it was taken for a library's, and the site named torch's Linear)
    torch_frame = "forward (/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py:125)"
    own = "build_cache (/home/u/proj/bin/train:41)"
    stack = ["<module> (/home/u/proj/bin/train:60)", "main (/home/u/proj/bin/train:55)", own, torch_frame]
    assert site_and_imports(";".join(stack))[0] == own
    assert site_and_imports(";".join(["<module> (/home/u/proj/bin/train:60)", torch_frame]))[0] == torch_frame
