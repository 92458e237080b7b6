"""The prediction's tables: a row's step and efficiency, the winner first, the scaling table's winner per size."""

from mpi_train.analysis.predict_tables import Row, format_scaling, format_single


def test_the_single_table_puts_the_fastest_method_first():
    slow = Row(ranks=4, method="ring", compute_s=0.010, comm_s=0.030, exposed_s=0.030)
    fast = Row(ranks=4, method="ddp", compute_s=0.010, comm_s=0.030, exposed_s=0.010)
    assert fast.step_s == 0.020 and fast.efficiency == 0.5
    lines = format_single([slow, fast]).splitlines()
    assert [line.split()[0] for line in lines] == ["method", "ddp", "ring"]
    assert lines[1].split()[1:] == ["10.0", "30.0", "10.0", "20.0", "0.50"]


def test_the_scaling_table_names_each_size_s_winner():
    table = {n: [Row(ranks=n, method="ring", compute_s=0.01, comm_s=0.0, exposed_s=0.001 * n),
                 Row(ranks=n, method="ddp", compute_s=0.01, comm_s=0.0, exposed_s=0.004)] for n in (2, 8)}
    lines = format_scaling(table).splitlines()
    assert lines[2].split()[-1] == "ring" and lines[3].split()[-1] == "ddp"
