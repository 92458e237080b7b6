from .cli import main
from .cluster import exit_process

exit_process(main())
