"""multiprocessing.Pool on Ray: Python's Pool interface, with actors as the processes.

Modelled on Ray's "Distributed multiprocessing.Pool" page.
"""

from rtml.util.multiprocessing import Pool


def cube(x):
    return x ** 3


def power(base, exponent):
    return base ** exponent


def check_positive(x):
    if x < 0:
        raise ValueError(f"{x} is negative")
    return x


# Pool() takes as many processes as the cluster has CPUs; here, two.
with Pool(processes=2) as pool:
    print("map:", pool.map(cube, range(6)))
    print("starmap:", pool.starmap(power, [(2, 3), (3, 2), (10, 0)]))

    # imap yields results in order as they finish; imap_unordered in any order.
    print("imap:", list(pool.imap(cube, range(4))))
    print("imap_unordered, sorted:", sorted(pool.imap_unordered(cube, range(4))))

    # apply runs one call and waits; apply_async returns an AsyncResult at once.
    print("apply:", pool.apply(power, (7, 2)))
    pending = [pool.apply_async(cube, (i,)) for i in range(3)]
    print("apply_async:", [result.get(timeout=30) for result in pending])

    # A callback runs in the driver once the result is there.
    collected = []
    pool.map_async(cube, [1, 2], callback=collected.append).wait(timeout=30)
    print("map_async callback got:", collected)

    # An exception in a pool process is raised by get(), as the function's own class.
    try:
        pool.map(check_positive, [1, -2, 3])
    except ValueError as error:
        assert "-2 is negative" in str(error)
        print("map raised the function's ValueError")
